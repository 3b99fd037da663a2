package ops

import (
	"fmt"
	"slices"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/mirrorprops"
	"github.com/kmirror/kmirror/raftstore"
)

// hookRuns are a mirror's failover hook runs as list shows them.
func hookRuns(m *raftstore.Mirror) []api.HookRunStatus {
	var out []api.HookRunStatus
	for _, r := range m.HookRuns {
		out = append(out, api.HookRunStatus{ID: r.EventID(m.Name), Topics: slices.Clone(r.Topics), Kind: r.Kind(), Reason: r.Reason,
			State: r.State(), StoppedAtMs: r.StoppedAtMs, Attempts: r.Attempts, LastAttemptMs: r.LastAttemptMs, LastError: r.LastError})
		if !r.Succeeded {
			out[len(out)-1].Succeeded = slices.Clone(r.SucceededHooks)
		}
	}
	return out
}

// hookNote says, for describe's STOPPED partitions of topic, how the
// failover hook of the topic's latest failover went ("" without one).
func hookNote(m *raftstore.Mirror, topic string) string {
	for i := len(m.HookRuns) - 1; i >= 0; i-- {
		r := m.HookRuns[i]
		if !slices.Contains(r.Topics, topic) {
			continue
		}
		note := fmt.Sprintf("failover hook %s: %s", r.EventID(m.Name), r.State())
		if r.Attempts > 0 {
			note += fmt.Sprintf(" (%d attempts)", r.Attempts)
		}
		if r.LastError != "" && !r.Succeeded {
			note += ": " + r.LastError
		}
		return note
	}
	return ""
}

// redactHookURL hides a webhook URL's secrets in props (already a copy).
func redactHookURL(props map[string]string) map[string]string {
	if u, ok := props[raftstore.PropFailoverHookURL]; ok {
		props[raftstore.PropFailoverHookURL] = mirrorprops.RedactURL(u)
	}
	return props
}
