package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/config"
	"github.com/kmirror/kmirror/daemon/httpapi"
	"github.com/kmirror/kmirror/integration/harness"
	"github.com/kmirror/kmirror/raftstore"
	"go.uber.org/zap/zaptest"
)

// TestApplyInternalTakesMemberCommands: the leader's internal route takes
// every command the command table lets a member submit, RecordGap among
// them (a follower that skipped an accepted gap records it through it),
// from the member it speaks for only, and refuses an operator's command.
func TestApplyInternalTakesMemberCommands(t *testing.T) {
	g, m, key := ownedPartition(t)
	ctx := context.Background()
	if err := m.store.Apply(ctx, raftstore.SetPartitionState{Key: key, State: raftstore.StateDiverged, Reason: "a gap"}); err != nil {
		t.Fatal(err)
	}
	if err := m.store.Apply(ctx, raftstore.ResumePartition{Key: key, AcceptGap: true}); err != nil {
		t.Fatal(err)
	}
	info := g.partitions(0)[key]
	entry, err := raftstore.Encode(raftstore.RecordGap{Key: key, Lease: raftstore.Lease{Owner: info.Owner, Generation: info.Generation}, From: 10, To: 15})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ApplyInternal(ctx, entry); !errors.Is(err, api.ErrInvalid) {
		t.Fatalf("a RecordGap through /v1/internal/apply from no named member: %v, want refused", err)
	}
	if err := m.ApplyInternal(api.WithCaller(ctx, api.Caller{Member: "n2"}), entry); !errors.Is(err, api.ErrInvalid) {
		t.Fatalf("member n2 sending %s's RecordGap: %v, want refused (a member speaks only for itself)", info.Owner, err)
	}
	ctx = api.WithCaller(ctx, api.Caller{Member: info.Owner})
	if err := m.ApplyInternal(ctx, entry); err != nil {
		t.Fatalf("a member's RecordGap through /v1/internal/apply: %v", err)
	}
	if got := g.partitions(0)[key]; got.SkippedRecords != 5 {
		t.Fatalf("skipped records %d after the recorded gap, want 5", got.SkippedRecords)
	}
	entry, err = raftstore.Encode(raftstore.ResumePartition{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ApplyInternal(ctx, entry); !errors.Is(err, api.ErrInvalid) {
		t.Fatalf("an operator's ResumePartition through /v1/internal/apply: %v, want refused", err)
	}
}

// ownedPartition starts a one-member group with one MIRRORING partition
// (m/t/0) and waits until the member owns it.
func ownedPartition(t *testing.T) (*group, *Member, raftstore.PartitionKey) {
	t.Helper()
	g := newGroup(t, 1, 2*time.Second)
	g.addTopic("t", 1)
	m := g.leader()
	key := raftstore.PartitionKey{Mirror: "m", Topic: "t", Partition: 0}
	waitFor(t, 10*time.Second, "the partition owned by "+m.cfg.NodeID, func() bool {
		info := g.partitions(0)[key]
		return info.Owner == m.cfg.NodeID && info.State == raftstore.StateMirroring
	})
	return g, m, key
}

// TestCheckCallerCertificate: with api.tls a member route's caller proves
// the member it names with its API certificate, which must verify and hold
// the host of that member's HTTP address; one whose common name is
// another member's ID speaks for that member only.
func TestCheckCallerCertificate(t *testing.T) {
	g := newGroup(t, 2, 2*time.Second)
	l := g.leader()
	dir := t.TempDir()
	ca, err := harness.NewCA("api-ca")
	if err != nil {
		t.Fatal(err)
	}
	issueAs := func(cn, ip string) *x509.Certificate {
		t.Helper()
		iss, err := ca.Issue(harness.CertOptions{CommonName: cn, IPs: []net.IP{net.ParseIP(ip)}})
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.X509KeyPair(iss.CertPEM, iss.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf
	}
	issue := func(ip string) *x509.Certificate { return issueAs("member", ip) }
	own, err := ca.Issue(harness.CertOptions{CommonName: "member", IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	l.auth, err = httpapi.NewAuth(config.APIConfig{TLS: config.APITLSConfig{CertFile: write("api.pem", own.CertPEM),
		KeyFile: write("api-key.pem", own.KeyPEM), CAFile: write("ca.pem", ca.PEM)}}, "n1", zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.checkCaller(api.Caller{Member: "n1", Cert: issue("127.0.0.1"), TLS: true}); err != nil {
		t.Fatalf("n1 with a certificate for its HTTP host: %v", err)
	}
	if err := l.checkCaller(api.Caller{Member: "n1", Cert: issueAs("n1", "127.0.0.1"), TLS: true}); err != nil {
		t.Fatalf("n1 with a certificate naming it: %v", err)
	}
	for name, c := range map[string]api.Caller{
		"no certificate":                   {Member: "n1", TLS: true},
		"another host's certificate":       {Member: "n1", Cert: issue("10.1.1.1"), TLS: true},
		"a member the group does not know": {Member: "n7", Cert: issue("127.0.0.1"), TLS: true},
		"no member named":                  {Cert: issue("127.0.0.1"), TLS: true},
		"another member's certificate":     {Member: "n1", Cert: issueAs("n2", "127.0.0.1"), TLS: true},
	} {
		if err := l.checkCaller(c); !errors.Is(err, api.ErrInvalid) {
			t.Errorf("%s: %v, want refused", name, err)
		}
	}
}

// TestApplyInternalKeepsMemberAddresses: a caller naming a member (taken
// as given without api.tls) cannot rewrite that member's recorded
// addresses, to which the others forward requests with the API token and
// mirror properties; the same record with its own addresses is taken
// (issue 18: the leader's HTTP address was redirected this way).
func TestApplyInternalKeepsMemberAddresses(t *testing.T) {
	_, m, _ := ownedPartition(t)
	ctx := api.WithCaller(context.Background(), api.Caller{Member: m.cfg.NodeID})
	var rec raftstore.Member
	m.store.Read(func(s *raftstore.State) { rec = *s.Members[m.cfg.NodeID] })
	moved := rec
	moved.HTTPAddr = "127.0.0.1:9999"
	entry, err := raftstore.Encode(raftstore.UpsertMember{Member: moved})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ApplyInternal(ctx, entry); !errors.Is(err, api.ErrInvalid) {
		t.Fatalf("a member record moved to another HTTP address through /v1/internal/apply: %v, want refused", err)
	}
	m.store.Read(func(s *raftstore.State) { rec = *s.Members[m.cfg.NodeID] })
	if rec.HTTPAddr == "127.0.0.1:9999" {
		t.Fatal("the recorded HTTP address was rewritten")
	}
	rec.Draining = false
	rec.LeaseTTLMs = 2000
	if entry, err = raftstore.Encode(raftstore.UpsertMember{Member: rec}); err != nil {
		t.Fatal(err)
	}
	if err := m.ApplyInternal(ctx, entry); err != nil {
		t.Fatalf("the member's own record with its own addresses: %v", err)
	}
	// The two-step redirect a trial found: first the same record marked
	// not joined (which let the next one move the addresses), and a lease
	// that never ends (a killed member's partitions never moved).
	for name, mod := range map[string]func(*raftstore.Member){
		"not joined":       func(r *raftstore.Member) { r.Joined = false },
		"a 24,000 h lease": func(r *raftstore.Member) { r.LeaseTTLMs = 86_400_000_000 },
	} {
		bad := rec
		mod(&bad)
		if entry, err = raftstore.Encode(raftstore.UpsertMember{Member: bad}); err != nil {
			t.Fatal(err)
		}
		if err := m.ApplyInternal(ctx, entry); !errors.Is(err, api.ErrInvalid) {
			t.Fatalf("%s: %v, want refused", name, err)
		}
	}
	m.store.Read(func(s *raftstore.State) { rec = *s.Members[m.cfg.NodeID] })
	if !rec.Joined || rec.LeaseTTLMs != 2000 {
		t.Fatalf("a refused record changed the member's: %+v", rec)
	}
	// A made-up member, not in the raft configuration, announced by a
	// caller naming it.
	ghost := raftstore.Member{ID: "n9", RaftAddr: "127.0.0.1:21398", HTTPAddr: "127.0.0.1:21399", Joined: true}
	if entry, err = raftstore.Encode(raftstore.UpsertMember{Member: ghost}); err != nil {
		t.Fatal(err)
	}
	gctx := api.WithCaller(context.Background(), api.Caller{Member: "n9"})
	if err := m.ApplyInternal(gctx, entry); !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "not in the group's raft configuration") {
		t.Fatalf("announce of a member not in the raft configuration: %v, want refused", err)
	}
	// A member an operator added and that never started: an announce may
	// not give it other addresses than the ones added (another spelling
	// of them is its own).
	if err := m.store.AddNonvoter("n8", "127.0.0.1:21396"); err != nil {
		t.Fatal(err)
	}
	added := raftstore.Member{ID: "n8", RaftAddr: "127.0.0.1:21396", HTTPAddr: "127.0.0.1:21397"}
	if err := m.store.Apply(context.Background(), raftstore.UpsertMember{Member: added}); err != nil {
		t.Fatal(err)
	}
	n8 := api.WithCaller(context.Background(), api.Caller{Member: "n8"})
	for _, tc := range []struct {
		http string
		ok   bool
	}{{"127.0.0.1:21399", false}, {"localhost:21397", true}} {
		a := added
		a.HTTPAddr, a.Joined = tc.http, true
		if entry, err = raftstore.Encode(raftstore.UpsertMember{Member: a}); err != nil {
			t.Fatal(err)
		}
		err := m.ApplyInternal(n8, entry)
		if tc.ok != (err == nil) {
			t.Fatalf("first announce of n8 at http %s (added at %s): %v, want accepted %t", tc.http, added.HTTPAddr, err, tc.ok)
		}
	}
}
