package owner

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/raftstore"
)

// Commands a member sends the leader about its own partitions and itself:
// kept per key until applied (the outbox), or retried until applied.

// submitRetry submits cmd until it is applied, refused for good (a stale
// lease: the state moved on), or ctx ends; settled is false only in the
// last case.
func (o *Owner) submitRetry(ctx context.Context, cmd raftstore.Command) (settled bool) {
	for {
		err := o.member.Submit(ctx, cmd)
		if err == nil || permanent(err) {
			if err != nil {
				o.log.Info("command refused", zap.Stringer("command", cmd.Type()), zap.Error(err))
			}
			return true
		}
		if ctx.Err() != nil {
			o.log.Warn("command not applied", zap.Stringer("command", cmd.Type()), zap.Error(err))
			return false
		}
		sleepCtx(ctx, 300*time.Millisecond)
	}
}

// permanent reports whether a refused command must not be retried.
func permanent(err error) bool {
	return errors.Is(err, api.ErrStale) || errors.Is(err, api.ErrInvalid) || errors.Is(err, api.ErrNotFound) || errors.Is(err, api.ErrExists)
}

// outbox holds the latest command per key that must reach the leader, and
// retries each until it is applied or refused for good. A newer command
// for the same key replaces an older one not yet sent (desired state, not
// a queue of events).
type outbox struct {
	owner *Owner
	mu    sync.Mutex
	cmds  map[string]pendingCmd
	// last is the latest command put under each key, kept after it was
	// sent (see lastIs).
	last map[string]raftstore.Command
	seq  uint64
	kick chan struct{}
}

type pendingCmd struct {
	cmd raftstore.Command
	seq uint64
}

func newOutbox(o *Owner) *outbox {
	return &outbox{owner: o, cmds: map[string]pendingCmd{}, last: map[string]raftstore.Command{}, kick: make(chan struct{}, 1)}
}

// lastIs reports whether the latest command put under key satisfies same,
// or none was put since this member started.
func (b *outbox) lastIs(key string, same func(raftstore.Command) bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	last, ok := b.last[key]
	return !ok || same(last)
}

func (b *outbox) put(key string, cmd raftstore.Command) {
	b.mu.Lock()
	b.seq++
	b.cmds[key] = pendingCmd{cmd, b.seq}
	b.last[key] = cmd
	b.mu.Unlock()
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// drop forgets the command waiting under key.
func (b *outbox) drop(key string) {
	b.mu.Lock()
	delete(b.cmds, key)
	b.mu.Unlock()
}

func (b *outbox) run() {
	for {
		select {
		case <-b.owner.ctx.Done():
			return
		case <-b.kick:
		case <-time.After(500 * time.Millisecond):
		}
		b.flush()
	}
}

// flush submits each waiting command once; a command stays waiting when its
// submit failed and may succeed later, or when a newer one replaced it.
func (b *outbox) flush() {
	b.mu.Lock()
	batch := make(map[string]pendingCmd, len(b.cmds))
	for k, c := range b.cmds {
		batch[k] = c
	}
	b.mu.Unlock()
	for key, pc := range batch {
		ctx, cancel := context.WithTimeout(b.owner.ctx, 5*time.Second)
		err := b.owner.member.Submit(ctx, pc.cmd)
		cancel()
		if err != nil && !permanent(err) {
			continue
		}
		if err != nil {
			b.owner.log.Info("report refused", zap.String("report", key), zap.Error(err))
		}
		b.mu.Lock()
		if b.cmds[key].seq == pc.seq {
			delete(b.cmds, key)
		}
		b.mu.Unlock()
	}
}
