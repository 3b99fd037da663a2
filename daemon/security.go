package daemon

import (
	"strings"

	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/ksec"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
	"github.com/kmirror/kmirror/raftstore"
)

// securityOf adapts checked security settings to the engine's dial hook:
// nil for PLAINTEXT, else a function that reads the settings' files and
// references at every dial (so replaced certificates and secrets apply to
// new connections without a restart).
func securityOf(s ksec.Settings) kafka.Security {
	if s.Protocol == "" || s.Protocol == ksec.Plaintext {
		return nil
	}
	return s.Resolve
}

// mirrorSecurity returns a mirror's source security settings. The
// properties were checked when the mirror was created or altered; an error
// here (a newer member's property) fails every dial with its message.
func mirrorSecurity(mir raftstore.Mirror) (kafka.Security, string) {
	s, err := ksec.Parse(mir.Properties, "mirror "+mir.Name)
	if err != nil {
		return func() (*kwire.Security, error) { return nil, err }, "invalid"
	}
	return securityOf(s), s.Key()
}

// sourceKey identifies how a mirror's source is reached: a cached
// connection is replaced when it changes.
func sourceKey(mir raftstore.Mirror) string {
	_, key := mirrorSecurity(mir)
	return strings.Join(mir.Bootstrap, ",") + "|" + key
}

// SourceAdmin opens an Admin on a mirror's source cluster.
func (m *Member) SourceAdmin(mir raftstore.Mirror) *kafka.Admin {
	sec, _ := mirrorSecurity(mir)
	return kafka.NewAdmin("source cluster of mirror "+mir.Name, mir.Bootstrap, m.cfg.Destination.ClientID, sec)
}

// sourceOf is the engine's view of a mirror's source cluster.
func sourceOf(mir raftstore.Mirror) fetch.Source {
	sec, key := mirrorSecurity(mir)
	return fetch.Source{Bootstrap: mir.Bootstrap, Security: sec, SecurityKey: key}
}

// SourceKey changes when a mirror's source connection settings do
// (leader.Member).
func (m *Member) SourceKey(mir raftstore.Mirror) string { return sourceKey(mir) }
