package daemon

import (
	"github.com/kmirror/kmirror/daemon/mirrorprops"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// SourceAdmin opens an Admin on a mirror's source cluster.
func (m *Member) SourceAdmin(mir raftstore.Mirror) *kafka.Admin {
	return mirrorprops.SourceAdmin(mir, m.cfg.Destination.ClientID)
}

// SourceKey changes when a mirror's source connection settings do
// (leader.Member).
func (m *Member) SourceKey(mir raftstore.Mirror) string { return mirrorprops.SourceKey(mir) }
