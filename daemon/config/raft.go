package config

import (
	"crypto/tls"
	"fmt"
	"net"

	"github.com/kmirror/kmirror/raftstore"
)

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

func (r RaftTLSConfig) Enabled() bool { return r.CertFile != "" || r.KeyFile != "" || r.CAFile != "" }

// validate checks raft_tls; advertise is the raft address other members
// dial, whose host the certificate must hold.
func (r RaftTLSConfig) validate(errs *problems, advertise string) {
	if !r.Enabled() {
		return
	}
	t, err := r.Build()
	if err != nil {
		errs.add("raft_tls", "%v", err)
		return
	}
	if host, _, err := net.SplitHostPort(advertise); err == nil {
		if err := CertHoldsHost(t.Server.Certificates[0], host); err != nil {
			errs.add("raft_tls.cert_file", "%v: the other members dial this member's raft at %s (raft_advertise)", err, advertise)
		}
	}
}

// build returns the transport's TLS settings; nil when raft_tls is not set.
func (r RaftTLSConfig) Build() (*raftstore.TLS, error) {
	if !r.Enabled() {
		return nil, nil
	}
	if r.CertFile == "" || r.KeyFile == "" || r.CAFile == "" {
		return nil, fmt.Errorf("set cert_file, key_file and ca_file (PEM), or none of them")
	}
	cert, err := tls.LoadX509KeyPair(r.CertFile, r.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("cert_file %s and key_file %s: %v", r.CertFile, r.KeyFile, err)
	}
	pool, err := CertPool(r.CAFile)
	if err != nil {
		return nil, fmt.Errorf("ca_file: %v", err)
	}
	return &raftstore.TLS{
		Server: &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert},
		Client: &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, RootCAs: pool},
	}, nil
}
