package raftstore

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/zap"

	"github.com/kmirror/kmirror/integration/harness"
)

// memberTLS issues a member certificate for 127.0.0.1 from ca and returns
// the transport settings trusting ca.
func memberTLS(t *testing.T, ca *harness.CA, cn string) *TLS {
	t.Helper()
	iss, err := ca.Issue(harness.CertOptions{CommonName: cn, IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(iss.CertPEM, iss.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return &TLS{
		Server: &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13},
		Client: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS13},
	}
}

func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestMutualTLSKeepsStrangersOut forms a 3-member group over mutual TLS,
// then sends the leader an AppendEntries with a far higher term, which
// makes any raft leader step down: from a process with a certificate of
// another CA it must fail and change nothing; from one with a member
// certificate (the control) it does disturb the group.
func TestMutualTLSKeepsStrangersOut(t *testing.T) {
	ca, err := harness.NewCA("members")
	if err != nil {
		t.Fatal(err)
	}
	var peers []Server
	for i := range 3 {
		peers = append(peers, Server{ID: fmt.Sprintf("n%d", i+1), Addr: freeLoopback(t), Voter: true})
	}
	stores := make([]*Store, 3)
	for i, p := range peers {
		cfg := fastConfig(t, p.ID)
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
		cfg.InMemory, cfg.Bootstrap, cfg.Peers, cfg.RaftAddr = true, true, peers, p.Addr
		cfg.TLS = memberTLS(t, ca, p.ID)
		stores[i] = mustOpen(t, cfg)
	}
	var leader *Store
	eventually(t, "a leader over mutual TLS", func() bool {
		for _, s := range stores {
			if s.IsLeader() {
				leader = s
				return true
			}
		}
		return false
	})
	ctx := ctxT(t)
	if err := leader.Apply(ctx, CreateMirror{Mirror: Mirror{Name: "m1"}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range stores {
		eventually(t, "m1 replicated over TLS", func() bool { return storeState(s).Mirrors["m1"] != nil })
	}
	leaderAddr, leaderID := leader.Leader()
	term := func() uint64 {
		n, _ := strconv.ParseUint(leader.Stats()["term"], 10, 64)
		return n
	}
	before := term()

	disturb := func(t *TLS) error {
		layer, err := newStreamLayer("127.0.0.1:0", nil, t, zap.NewNop())
		if err != nil {
			return err
		}
		tr := raft.NewNetworkTransport(layer, 1, time.Second, nil)
		defer tr.Close()
		defer layer.setCut(true) // closes the pooled connection too
		var resp raft.AppendEntriesResponse
		return tr.AppendEntries(raft.ServerID(leaderID), raft.ServerAddress(leaderAddr), &raft.AppendEntriesRequest{
			RPCHeader: raft.RPCHeader{ID: []byte("rogue"), Addr: []byte("127.0.0.1:1")},
			Term:      before + 100,
		}, &resp)
	}
	other, _ := harness.NewCA("not-the-members")
	if err := disturb(memberTLS(t, other, "rogue")); err == nil {
		t.Fatal("a peer with another CA's certificate reached the leader's raft transport")
	} else {
		t.Logf("stranger refused: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	if !leader.IsLeader() || term() != before {
		t.Fatalf("the group was disturbed by a stranger: leader %v, term %d -> %d", leader.IsLeader(), before, term())
	}
	// The control: the same message with a member certificate does reach
	// raft, which moves to the higher term (so the check above can fail).
	if err := disturb(memberTLS(t, ca, "n9")); err != nil {
		t.Fatalf("control with a member certificate: %v", err)
	}
	eventually(t, "the leader to take the control's higher term", func() bool { return term() >= before+100 })
}
