package leader

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/mirrorprops"
	"github.com/kmirror/kmirror/raftstore"
)

// hookGather is how long a failover hook run waits, after its last topic
// stopped, for the other topics stopping for the same reason (an automatic
// failover stops every topic of the mirror), so one run carries them all.
const hookGather = 30 * time.Second

// hookPoll bounds how long the hook loop sleeps without a state change.
const hookPoll = 5 * time.Second

// hookBackoff is the wait after a failed attempt n (1, 2, 4 ... 60 s).
func hookBackoff(n int) time.Duration {
	if n > 7 {
		return time.Minute
	}
	return min(time.Minute, time.Second<<(n-1))
}

// HookEvent is the JSON a failover hook gets: the webhook's POST body,
// the exec hook's standard input (issue 22, section 5). ID is the same in
// every attempt of one failover (the webhook's Idempotency-Key header),
// Attempt counts from 1.
type HookEvent struct {
	ID     string   `json:"id"`
	Mirror string   `json:"mirror"`
	Topics []string `json:"topics"`
	// Kind is remove (an operator's kmirror remove), switchover (remove
	// --wait-for-sync) or automatic (failover.auto.after.ms); Reason is the
	// topics' reason ("" for remove).
	Kind        string `json:"kind"`
	Reason      string `json:"reason,omitempty"`
	StoppedAtMs int64  `json:"stopped_at_ms"`
	Attempt     int    `json:"attempt"`
	// Positions are each topic's last mirrored positions: where the
	// destination's copy ends and which source offset that is.
	Positions map[string][]HookPosition `json:"positions"`
}

// HookPosition is one partition's last mirrored position: the next source
// offset and the next destination offset.
type HookPosition struct {
	Partition         int32 `json:"partition"`
	SourceOffset      int64 `json:"source_offset"`
	DestinationOffset int64 `json:"destination_offset"`
}

func hookEvent(mirror string, r raftstore.HookRun, attempt int) HookEvent {
	ev := HookEvent{ID: r.EventID(mirror), Mirror: mirror, Topics: r.Topics, Kind: r.Kind(), Reason: r.Reason,
		StoppedAtMs: r.StoppedAtMs, Attempt: attempt, Positions: map[string][]HookPosition{}}
	for t, ps := range r.Positions {
		for i, p := range ps {
			ev.Positions[t] = append(ev.Positions[t], HookPosition{Partition: int32(i), SourceOffset: p.SourceOffset, DestinationOffset: p.DestinationOffset})
		}
	}
	return ev
}

// HookRunStates counts, per mirror and state (pending, retrying,
// succeeded, failed), the failover hook runs in the replicated state, for
// kmirror_failover_hook_runs; empty on a member that does not lead (the
// leader exports them, once for the group).
func (l *Leader) HookRunStates() map[[2]string]int {
	out := map[[2]string]int{}
	if !l.store.IsLeader() {
		return out
	}
	l.store.Read(func(s *raftstore.State) {
		for name, m := range s.Mirrors {
			if !m.HasFailoverHook() && len(m.HookRuns) == 0 {
				continue
			}
			for _, st := range []string{api.HookPending, api.HookRetrying, api.HookSucceeded, api.HookFailed} {
				out[[2]string{name, st}] += 0
			}
			for _, r := range m.HookRuns {
				out[[2]string{name, r.State()}]++
			}
		}
	})
	return out
}

// hookJob is a pending run as the loop found it.
type hookJob struct {
	mirror   string
	run      raftstore.HookRun
	hook     mirrorprops.Hook
	parseErr error
	// gathering: a topic of the mirror is still STOPPING for the run's
	// reason.
	gathering bool
}

// hookLoop runs the mirrors' failover hooks while this member leads: each
// pending run (raftstore.HookRun) once its topics have all stopped, then
// again after a failure, with backoff, until it succeeds or its retries
// run out. Every attempt is recorded in raft before the next, so a new
// leader goes on from there.
func (l *Leader) hookLoop(ctx context.Context) {
	changed, unwatch := l.store.Watch()
	defer unwatch()
	for {
		wait := l.runHooks(ctx)
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-time.After(wait):
		}
	}
}

// runHooks makes the attempts due now, one after the other, and returns
// how long until the next one is due (at most hookPoll).
func (l *Leader) runHooks(ctx context.Context) time.Duration {
	var jobs []hookJob
	l.store.Read(func(s *raftstore.State) {
		for name, m := range s.Mirrors {
			for _, r := range m.HookRuns {
				if r.Done {
					continue
				}
				j := hookJob{mirror: name, run: r.Clone()}
				settings, err := mirrorprops.Parse(name, m.Properties)
				j.hook, j.parseErr = settings.Hook, err
				for _, t := range s.Topics {
					j.gathering = j.gathering || (t.Mirror == name && t.State == raftstore.StateStopping && t.Reason == r.Reason)
				}
				jobs = append(jobs, j)
			}
		}
	})
	sort.Slice(jobs, func(a, b int) bool { return jobs[a].run.ID < jobs[b].run.ID })
	next := hookPoll
	for _, j := range jobs {
		var due time.Time
		if j.run.Attempts == 0 {
			if j.gathering {
				due = time.UnixMilli(j.run.StoppedAtMs).Add(hookGather)
			}
		} else {
			due = time.UnixMilli(j.run.LastAttemptMs).Add(hookBackoff(j.run.Attempts))
		}
		if at, ok := l.hookRetryAt.Load(j.run.ID); ok && at.(time.Time).After(due) {
			due = at.(time.Time)
		}
		if wait := time.Until(due); wait > 0 {
			next = min(next, wait)
			continue
		}
		if ctx.Err() != nil {
			return next
		}
		l.attemptHook(ctx, j)
	}
	return next
}

// attemptHook makes one attempt at a run and records it.
func (l *Leader) attemptHook(ctx context.Context, j hookJob) {
	attempt := j.run.Attempts + 1
	ev := hookEvent(j.mirror, j.run, attempt)
	var err error
	var succeeded []string
	switch {
	case j.parseErr != nil:
		err = fmt.Errorf("the mirror's properties do not parse: %w", j.parseErr)
	case j.hook.Exec == "" && j.hook.URL == "":
		err = errors.New("the mirror's properties no longer name a failover hook (failover.hook.exec, failover.hook.url)")
	default:
		succeeded, err = runHook(ctx, l.cfg.HooksDir, j.hook, ev, j.run.SucceededHooks)
	}
	done := err == nil || attempt > j.hook.Retries || j.parseErr != nil || (j.hook.Exec == "" && j.hook.URL == "")
	cmd := raftstore.RecordHookAttempt{Mirror: j.mirror, ID: j.run.ID, Attempt: attempt, AtMs: time.Now().UnixMilli(), Done: done,
		Topics: ev.Topics, Succeeded: succeeded}
	if err != nil {
		cmd.Error = err.Error()
	}
	l.hookAttempts.add(j.mirror + "\x00" + map[bool]string{true: "ok", false: "error"}[err == nil])
	if done && err != nil {
		l.hookGaveUp.add(j.mirror)
	}
	fields := []zap.Field{zap.String("mirror", j.mirror), zap.String("id", ev.ID), zap.Strings("topics", ev.Topics), zap.String("kind", ev.Kind),
		zap.Int("attempt", attempt)}
	switch {
	case err == nil:
		l.log.Info("failover hook succeeded", fields...)
	case done:
		l.log.Error("failover hook failed; giving up (failover.hook.retries)", append(fields, zap.Error(err))...)
	default:
		l.log.Warn("failover hook failed; retrying", append(fields, zap.Error(err), zap.Duration("retry_in", hookBackoff(attempt)))...)
	}
	if aerr := l.store.Apply(ctx, cmd); aerr != nil {
		// Not recorded: made again, after the backoff while this member
		// leads (hookRetryAt), at once by the next leader.
		l.hookRetryAt.Store(j.run.ID, time.Now().Add(hookBackoff(attempt)))
		l.log.Warn("failover hook attempt not recorded: made again", append(fields, zap.Error(aerr))...)
	}
}

// runHook runs the exec hook and POSTs to the webhook (each configured
// one not in done, which succeeded in an earlier attempt; each within the
// hook's timeout). It returns the hooks that succeeded now
// (raftstore.HookExec, HookURL) and an error naming what failed.
func runHook(ctx context.Context, dir string, h mirrorprops.Hook, ev HookEvent, done []string) (succeeded []string, err error) {
	body, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}
	var errs []error
	if h.Exec != "" && !slices.Contains(done, raftstore.HookExec) {
		if err := runHookExec(ctx, dir, h.Exec, h.Timeout, body, ev); err != nil {
			errs = append(errs, err)
		} else {
			succeeded = append(succeeded, raftstore.HookExec)
		}
	}
	if h.URL != "" && !slices.Contains(done, raftstore.HookURL) {
		if err := postHook(ctx, h.URL, h.Timeout, body, ev.ID); err != nil {
			errs = append(errs, err)
		} else {
			succeeded = append(succeeded, raftstore.HookURL)
		}
	}
	return succeeded, errors.Join(errs...)
}

// runHookExec runs hooks_dir/name with the event on its standard input and
// in KMIRROR_* environment variables; its process group is killed at the
// timeout. The error carries the end of its output.
func runHookExec(ctx context.Context, dir, name string, timeout time.Duration, body []byte, ev HookEvent) error {
	path := filepath.Join(dir, name)
	if fi, err := os.Stat(path); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("failover.hook.exec %s: %s is not an executable file on this member: install it in hooks_dir (%s) on every member", name, path, dir)
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, path)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "KMIRROR_HOOK_ID="+ev.ID, "KMIRROR_MIRROR="+ev.Mirror, "KMIRROR_TOPICS="+strings.Join(ev.Topics, ","),
		"KMIRROR_KIND="+ev.Kind, "KMIRROR_REASON="+ev.Reason, fmt.Sprintf("KMIRROR_ATTEMPT=%d", ev.Attempt))
	cmd.Stdin = bytes.NewReader(body)
	out := &tailWriter{max: 2048}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if errors.Is(err, exec.ErrWaitDelay) && cmd.ProcessState != nil && cmd.ProcessState.Success() {
		// It exited 0 and left a child holding its output: that is its
		// business, the hook succeeded.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		err = nil
	}
	switch {
	case cctx.Err() == context.DeadlineExceeded:
		return fmt.Errorf("failover.hook.exec %s: no exit within %s (failover.hook.timeout.ms): killed; output: %s", name, timeout, out.text())
	case err != nil:
		return fmt.Errorf("failover.hook.exec %s: %v; output: %s", name, err, out.text())
	}
	return nil
}

// postHook POSTs the event to url; a 2xx answer is success.
func postHook(ctx context.Context, url string, timeout time.Duration, body []byte, id string) error {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("failover.hook.url: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", id)
	req.Header.Set("User-Agent", "kmirror")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		var ue *neturl.Error
		if errors.As(err, &ue) {
			err = ue.Err // its text repeats the URL, token and all
		}
		return fmt.Errorf("failover.hook.url %s: %v", mirrorprops.RedactURL(url), err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("failover.hook.url %s: HTTP %d: %s", mirrorprops.RedactURL(url), resp.StatusCode, strings.TrimSpace(string(answer)))
	}
	return nil
}

// tailWriter keeps the last max bytes written.
type tailWriter struct {
	max int
	b   []byte
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	if len(w.b) > w.max {
		w.b = append([]byte("..."), w.b[len(w.b)-w.max:]...)
	}
	return len(p), nil
}

func (w *tailWriter) text() string {
	s := strings.TrimSpace(string(w.b))
	if s == "" {
		return "(none)"
	}
	return strings.ReplaceAll(s, "\n", " | ")
}
