package raftstore

import (
	"fmt"
	"slices"
	"strings"
)

// Mirror properties that name a failover hook (issue 22, section 5); the
// rest of their checks are mirrorprops'. A mirror with either gets a
// HookRun for each failover.
const (
	PropFailoverHookExec = "failover.hook.exec"
	PropFailoverHookURL  = "failover.hook.url"
)

// maxHookRuns bounds Mirror.HookRuns: the oldest finished runs go first.
const maxHookRuns = 20

// HookRun is one failover's run of its mirror's failover hook. The apply
// that stops a topic's last partition creates it (so there is exactly one
// per failover, whichever member leads), when the mirror has a hook;
// topics stopped for the same reason before the run's first attempt join
// it (an automatic failover stops every topic of the mirror). The leader
// runs it and records each attempt (RecordHookAttempt) before the next, so
// a new leader goes on from the attempts recorded; an attempt whose leader
// died before recording it is made again, with the same ID, for the
// receiver to tell.
type HookRun struct {
	// ID is the raft index of the entry that created the run.
	ID     uint64   `json:"id"`
	Topics []string `json:"topics"`
	// Reason is why the topics stopped: the topic's reason (an automatic
	// failover, a planned switchover), "" for an operator's remove.
	Reason string `json:"reason,omitempty"`
	// Positions are each topic's last mirrored positions, per partition.
	Positions map[string][]Position `json:"positions"`
	// StoppedAtMs is when the last topic joined (Unix ms, the leader's
	// append time); LastAttemptMs when the last attempt ended.
	StoppedAtMs   int64  `json:"stopped_at_ms"`
	Attempts      int    `json:"attempts,omitempty"`
	LastAttemptMs int64  `json:"last_attempt_ms,omitempty"`
	LastError     string `json:"last_error,omitempty"`
	// Done: the hook succeeded (Succeeded) or its attempts ran out.
	Done      bool `json:"done,omitempty"`
	Succeeded bool `json:"succeeded,omitempty"`
	// SucceededHooks are the hooks of a mirror with both (HookExec,
	// HookURL) that succeeded in an earlier attempt: a retry runs only the
	// others, so a command that switched DNS is not run again because the
	// webhook failed.
	SucceededHooks []string `json:"succeeded_hooks,omitempty"`
}

// The hooks of a run (HookRun.SucceededHooks).
const (
	HookExec = "exec"
	HookURL  = "url"
)

// Clone returns a deep copy of r.
func (r HookRun) Clone() HookRun {
	c := r
	c.Topics = slices.Clone(r.Topics)
	c.SucceededHooks = slices.Clone(r.SucceededHooks)
	if r.Positions != nil {
		c.Positions = make(map[string][]Position, len(r.Positions))
		for t, p := range r.Positions {
			c.Positions[t] = slices.Clone(p)
		}
	}
	return c
}

// EventID is the run's event ID, the same in every attempt (the
// webhook's Idempotency-Key): the mirror and the raft index.
func (r HookRun) EventID(mirror string) string { return fmt.Sprintf("%s-%d", mirror, r.ID) }

// The stop reasons a failover's kind is read from (HookRun.Kind): a
// planned switchover's (ops.SwitchoverTopic) is ReasonSwitchover, an
// automatic failover's (the leader's checkAutoFailover) starts with
// ReasonAutomaticFailover; an operator's kmirror remove gives none.
const (
	ReasonSwitchover        = "planned switchover (remove --wait-for-sync)"
	ReasonAutomaticFailover = "automatic failover: "
)

// Kind names what stopped the run's topics, from their reason: remove (an
// operator's kmirror remove, no reason), switchover, automatic, or other.
func (r HookRun) Kind() string {
	switch {
	case r.Reason == "":
		return "remove"
	case r.Reason == ReasonSwitchover:
		return "switchover"
	case strings.HasPrefix(r.Reason, ReasonAutomaticFailover):
		return "automatic"
	}
	return "other"
}

// State is the run's state as describe and list show it (api.Hook*):
// pending (no attempt yet), retrying, succeeded or failed.
func (r HookRun) State() string {
	switch {
	case r.Succeeded:
		return "succeeded"
	case r.Done:
		return "failed"
	case r.Attempts > 0:
		return "retrying"
	}
	return "pending"
}

// HasFailoverHook reports whether the mirror's properties name a failover
// hook.
func (m *Mirror) HasFailoverHook() bool {
	return m.Properties[PropFailoverHookExec] != "" || m.Properties[PropFailoverHookURL] != ""
}

// noteFailover records topic t's failover (all its partitions STOPPED) in
// its mirror's hook runs, when the mirror has a hook.
func (s *State) noteFailover(t *MirrorTopic, index uint64) {
	m, ok := s.Mirrors[t.Mirror]
	if !ok || !m.HasFailoverHook() {
		return
	}
	pos := make([]Position, len(t.Partitions))
	for i, p := range t.Partitions {
		if p.LastMirrored != nil {
			pos[i] = *p.LastMirrored
		}
	}
	for i := range m.HookRuns {
		r := &m.HookRuns[i]
		if !r.Done && r.Attempts == 0 && r.Reason == t.Reason {
			if !slices.Contains(r.Topics, t.Topic) {
				r.Topics = append(r.Topics, t.Topic)
			}
			r.Positions[t.Topic], r.StoppedAtMs = pos, s.appendedAtMs
			return
		}
	}
	m.HookRuns = append(m.HookRuns, HookRun{ID: index, Topics: []string{t.Topic}, Reason: t.Reason,
		Positions: map[string][]Position{t.Topic: pos}, StoppedAtMs: s.appendedAtMs})
	for len(m.HookRuns) > maxHookRuns {
		i := slices.IndexFunc(m.HookRuns, func(r HookRun) bool { return r.Done })
		if i < 0 {
			break // every run still pending: none is dropped
		}
		m.HookRuns = slices.Delete(m.HookRuns, i, i+1)
	}
}

// RecordHookAttempt records one attempt of the leader's at a hook run:
// Error "" succeeded; Done also when the attempts ran out (or the hook was
// taken out of the mirror's properties).
type RecordHookAttempt struct {
	Mirror string `json:"mirror"`
	ID     uint64 `json:"id"`
	// Attempt is the attempt's number (1 first): a leader that recorded
	// it already (a retried apply) is refused.
	Attempt int `json:"attempt"`
	// Topics are the topics the attempt announced: a topic that joined
	// the run while its first attempt ran (not among them) is moved to a
	// run of its own, announced by the next attempts. Empty: all of them.
	Topics []string `json:"topics,omitempty"`
	AtMs   int64    `json:"at_ms"`
	Error  string   `json:"error,omitempty"`
	Done   bool     `json:"done,omitempty"`
	// Succeeded are the hooks that succeeded in this attempt (HookExec,
	// HookURL), also when another failed.
	Succeeded []string `json:"succeeded,omitempty"`
}

func (RecordHookAttempt) Type() CommandType { return TypeRecordHookAttempt }

func (s *State) applyRecordHookAttempt(c RecordHookAttempt, index uint64) error {
	m, ok := s.Mirrors[c.Mirror]
	if !ok {
		return fmt.Errorf("%w: mirror %q", ErrNotFound, c.Mirror)
	}
	i := slices.IndexFunc(m.HookRuns, func(r HookRun) bool { return r.ID == c.ID })
	if i < 0 {
		return fmt.Errorf("%w: failover hook run %d of mirror %q", ErrNotFound, c.ID, c.Mirror)
	}
	r := &m.HookRuns[i]
	if r.Done || c.Attempt != r.Attempts+1 {
		return fmt.Errorf("%w: failover hook run %d of mirror %q has %d attempts recorded (done: %t), not %d", ErrInvalid,
			c.ID, c.Mirror, r.Attempts, r.Done, c.Attempt-1)
	}
	var late []string
	for _, t := range r.Topics {
		if len(c.Topics) > 0 && !slices.Contains(c.Topics, t) {
			late = append(late, t)
		}
	}
	r.Attempts, r.LastAttemptMs, r.LastError = c.Attempt, c.AtMs, c.Error
	r.Succeeded = c.Error == ""
	for _, h := range c.Succeeded {
		if !slices.Contains(r.SucceededHooks, h) {
			r.SucceededHooks = append(r.SucceededHooks, h)
		}
	}
	r.Done = r.Succeeded || c.Done
	if len(late) > 0 {
		split := HookRun{ID: index, Topics: late, Reason: r.Reason, Positions: map[string][]Position{}, StoppedAtMs: r.StoppedAtMs}
		for _, t := range late {
			split.Positions[t] = r.Positions[t]
			delete(r.Positions, t)
		}
		r.Topics = slices.DeleteFunc(r.Topics, func(t string) bool { return slices.Contains(late, t) })
		m.HookRuns = append(m.HookRuns, split)
	}
	return nil
}
