package mirrorprops

import (
	"strconv"
	"strings"

	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/ksec"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
	"github.com/kmirror/kmirror/raftstore"
)

// SecurityOf adapts checked security settings to the cluster clients' dial
// hook: nil for PLAINTEXT, else a function that reads the settings' files
// and references at every dial (so replaced certificates and secrets apply
// to new connections without a restart).
func SecurityOf(s ksec.Settings) kafka.Security {
	if s.Protocol == "" || s.Protocol == ksec.Plaintext {
		return nil
	}
	return s.Resolve
}

// Security returns a mirror's source security settings and their key. The
// properties were checked when the mirror was created or altered; an error
// here (a newer member's property) fails every dial with its message.
func Security(mir raftstore.Mirror) (kafka.Security, string) {
	s, err := ksec.Parse(mir.Properties, "mirror "+mir.Name)
	if err != nil {
		return func() (*kwire.Security, error) { return nil, err }, "invalid"
	}
	return SecurityOf(s), s.Key()
}

// SourceKey identifies how a mirror's source is reached: a cached
// connection is replaced when it changes.
func SourceKey(mir raftstore.Mirror) string {
	_, key := Security(mir)
	return strings.Join(mir.Bootstrap, ",") + "|" + key + "|" + ClientID(mir)
}

// ClientID is the mirror's client.id property: the Kafka client.id kmirror
// uses on the source ("": the member's destination.client_id).
func ClientID(mir raftstore.Mirror) string { return strings.TrimSpace(mir.Properties[propClientID]) }

// SourceAdmin opens an Admin on a mirror's source cluster with the
// mirror's client.id, else memberClientID (the member's Kafka client.id).
// The caller closes it.
func SourceAdmin(mir raftstore.Mirror, memberClientID string) *kafka.Admin {
	sec, _ := Security(mir)
	id := ClientID(mir)
	if id == "" {
		id = memberClientID
	}
	return kafka.NewAdmin("source cluster of mirror "+mir.Name, mir.Bootstrap, id, sec)
}

// Source is the data path's view of a mirror's source cluster.
func Source(mir raftstore.Mirror) fetch.Source {
	sec, key := Security(mir)
	// fetch.connections was checked at create or alter (Parse); a value
	// this version cannot read leaves the count to the round trip.
	conns, _ := strconv.Atoi(strings.TrimSpace(mir.Properties[propFetchConns]))
	return fetch.Source{Bootstrap: mir.Bootstrap, Security: sec, SecurityKey: key, ClientID: ClientID(mir), FetchConnections: max(conns, 0)}
}
