package daemon

import (
	"crypto/tls"
	"fmt"
	"net"
	"strings"

	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/ksec"
	"github.com/kmirror/kmirror/fetch/kwire"
	"github.com/kmirror/kmirror/raftstore"
)

// securityOf adapts checked security settings to the engine's dial hook:
// nil for PLAINTEXT, else a function that reads the settings' files and
// references at every dial (so replaced certificates and secrets apply to
// new connections without a restart).
func securityOf(s ksec.Settings) fetch.Security {
	if s.Protocol == "" || s.Protocol == ksec.Plaintext {
		return nil
	}
	return s.Resolve
}

// mirrorSecurity returns a mirror's source security settings. The
// properties were checked when the mirror was created or altered; an error
// here (a newer member's property) fails every dial with its message.
func mirrorSecurity(mir raftstore.Mirror) (fetch.Security, string) {
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

// newSourceAdmin opens an Admin on a mirror's source cluster.
func (m *Member) newSourceAdmin(mir raftstore.Mirror) *fetch.Admin {
	sec, _ := mirrorSecurity(mir)
	return fetch.NewAdmin("source cluster of mirror "+mir.Name, mir.Bootstrap, m.cfg.Destination.ClientID, sec)
}

// sourceOf is the engine's view of a mirror's source cluster.
func sourceOf(mir raftstore.Mirror) fetch.Source {
	sec, key := mirrorSecurity(mir)
	return fetch.Source{Bootstrap: mir.Bootstrap, Security: sec, SecurityKey: key}
}

// RaftTLSConfig turns on mutual TLS between members' raft transports
// (config section raft_tls). Every member needs it, with certificates
// signed by the same CA.
type RaftTLSConfig struct {
	// CertFile and KeyFile are this member's certificate chain and private
	// key (PEM), presented to the members it dials and that dial it. The
	// certificate must hold the host of this member's raft address (SAN).
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// CAFile holds the CA certificates (PEM) that sign every member's
	// certificate; a peer whose certificate it does not verify is refused.
	CAFile string `yaml:"ca_file"`
}

func (r RaftTLSConfig) enabled() bool { return r.CertFile != "" || r.KeyFile != "" || r.CAFile != "" }

// validate checks raft_tls; advertise is the raft address other members
// dial, whose host the certificate must hold.
func (r RaftTLSConfig) validate(errs *problems, advertise string) {
	if !r.enabled() {
		return
	}
	t, err := r.build()
	if err != nil {
		errs.add("raft_tls", "%v", err)
		return
	}
	if host, _, err := net.SplitHostPort(advertise); err == nil {
		if err := certHoldsHost(t.Server.Certificates[0], host); err != nil {
			errs.add("raft_tls.cert_file", "%v: the other members dial this member's raft at %s (raft_advertise)", err, advertise)
		}
	}
}

// build returns the transport's TLS settings; nil when raft_tls is not set.
func (r RaftTLSConfig) build() (*raftstore.TLS, error) {
	if !r.enabled() {
		return nil, nil
	}
	if r.CertFile == "" || r.KeyFile == "" || r.CAFile == "" {
		return nil, fmt.Errorf("set cert_file, key_file and ca_file (PEM), or none of them")
	}
	cert, err := tls.LoadX509KeyPair(r.CertFile, r.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("cert_file %s and key_file %s: %v", r.CertFile, r.KeyFile, err)
	}
	pool, err := certPool(r.CAFile)
	if err != nil {
		return nil, fmt.Errorf("ca_file: %v", err)
	}
	return &raftstore.TLS{
		Server: &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert},
		Client: &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, RootCAs: pool},
	}, nil
}
