package daemon

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
// lease: the state moved on), or ctx ends.
func (m *Member) submitRetry(ctx context.Context, cmd raftstore.Command) {
	for {
		err := m.submit(ctx, cmd)
		if err == nil || permanent(err) {
			if err != nil {
				m.log.Info("command refused", zap.Stringer("command", cmd.Type()), zap.Error(err))
			}
			return
		}
		if ctx.Err() != nil {
			m.log.Warn("command not applied", zap.Stringer("command", cmd.Type()), zap.Error(err))
			return
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
	m    *Member
	mu   sync.Mutex
	cmds map[string]pendingCmd
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

func newOutbox(m *Member) *outbox {
	return &outbox{m: m, cmds: map[string]pendingCmd{}, last: map[string]raftstore.Command{}, kick: make(chan struct{}, 1)}
}

// lastIs reports whether the latest command put under key satisfies same,
// or none was put since this member started.
func (o *outbox) lastIs(key string, same func(raftstore.Command) bool) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	last, ok := o.last[key]
	return !ok || same(last)
}

func (o *outbox) put(key string, cmd raftstore.Command) {
	o.mu.Lock()
	o.seq++
	o.cmds[key] = pendingCmd{cmd, o.seq}
	o.last[key] = cmd
	o.mu.Unlock()
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// drop forgets the command waiting under key.
func (o *outbox) drop(key string) {
	o.mu.Lock()
	delete(o.cmds, key)
	o.mu.Unlock()
}

func (o *outbox) run() {
	for {
		select {
		case <-o.m.ctx.Done():
			return
		case <-o.kick:
		case <-time.After(500 * time.Millisecond):
		}
		o.flush()
	}
}

// flush submits each waiting command once; a command stays waiting when its
// submit failed and may succeed later, or when a newer one replaced it.
func (o *outbox) flush() {
	o.mu.Lock()
	batch := make(map[string]pendingCmd, len(o.cmds))
	for k, c := range o.cmds {
		batch[k] = c
	}
	o.mu.Unlock()
	for key, pc := range batch {
		ctx, cancel := context.WithTimeout(o.m.ctx, 5*time.Second)
		err := o.m.submit(ctx, pc.cmd)
		cancel()
		if err != nil && !permanent(err) {
			continue
		}
		if err != nil {
			o.m.log.Info("report refused", zap.String("report", key), zap.Error(err))
		}
		o.mu.Lock()
		if o.cmds[key].seq == pc.seq {
			delete(o.cmds, key)
		}
		o.mu.Unlock()
	}
}
