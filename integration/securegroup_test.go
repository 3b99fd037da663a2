package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/integration/harness"
)

// TestSecureGroup runs a 3-member group whose API is served over TLS with
// a bearer token and whose raft transport uses mutual TLS: the group forms
// (members probe each other over HTTPS with the token), writes through a
// follower reach the leader, describe gathers every member's partitions,
// and the mirror copies record by record. The CLI needs --token-file and
// --ca and says so; only /healthz, /readyz and /metrics answer without a
// token. A member with a raft certificate from another CA never joins,
// and `members` says why.
func TestSecureGroup(t *testing.T) {
	dir := t.TempDir()
	ca, err := harness.NewCA("kmirror-members")
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
	iss, err := ca.Issue(harness.CertOptions{CommonName: "kmirror-member", IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	caFile, certFile, keyFile := write("ca.pem", ca.PEM), write("member.pem", iss.CertPEM), write("member-key.pem", iss.KeyPEM)
	const token = "4b1d0c2e9f-group-token"
	tokenFile := write("token", []byte(token+"\n"))
	extra := fmt.Sprintf(`api:
  tls: {cert_file: %[1]s, key_file: %[2]s, ca_file: %[3]s}
  token_file: %[4]s
raft_tls: {cert_file: %[1]s, key_file: %[2]s, ca_file: %[3]s}
`, certFile, keyFile, caFile, tokenFile)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	clientTLS := &tls.Config{RootCAs: pool}
	g := startGroupWith(t, "sg", 3, memberOpts{extra: extra, apiTLS: clientTLS, token: token})
	follower := g.members[0]
	if leaderIs(t, follower) {
		follower = g.members[1]
	}
	topic := "secure-group"
	mirrorStreams(t, follower, "sgm", []string{topic}, 3, 600, 0)()
	waitCaughtUp(t, follower, "sgm", topic)
	requireSameRecords(t, readAll(t, env.src, topic, 3, true), readAll(t, env.dst, topic, 3, true))

	// The CLI against the TLS API.
	base := []string{"--server", follower.url}
	withAuth := append(append([]string{}, base...), "--ca", caFile, "--token-file", tokenFile)
	out, errOut, code := cliArgs(t, append(withAuth, "describe")...)
	if code != 0 || !strings.Contains(out, topic) {
		t.Fatalf("describe with --ca and --token-file: exit %d\n%s%s", code, out, errOut)
	}
	wrong := write("wrong-token", []byte("not-the-token\n"))
	for _, c := range []struct {
		args []string
		want string
	}{
		{append(append([]string{}, base...), "--ca", caFile, "list"), "needs a bearer token: pass --token-file FILE (or KMIRROR_TOKEN_FILE)"},
		{append(append([]string{}, base...), "--ca", caFile, "--token-file", wrong, "list"), "the bearer token is not this kmirror group's"},
		{append(append([]string{}, base...), "--token-file", tokenFile, "list"), "pass --ca FILE (or KMIRROR_CA)"},
		{[]string{"--server", strings.Replace(follower.url, "https://", "http://", 1), "--token-file", tokenFile, "list"}, "serves HTTPS (api.tls): use https://"},
	} {
		_, errOut, code := cliArgs(t, c.args...)
		if code != 1 || !strings.Contains(errOut, c.want) {
			t.Errorf("kmirror %v: exit %d, stderr %q; want exit 1 saying %q", c.args, code, errOut, c.want)
		}
	}
	// Raw requests: open routes answer without the token, the rest 401.
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200, "/v1/mirrors": 401, "/v1/internal/status": 401} {
		resp, err := follower.httpc.Get(follower.url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s without a token: %d, want %d", path, resp.StatusCode, want)
		}
	}
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodDelete, follower.url+"/v1/mirrors/sgm", nil)
	if resp, err := follower.httpc.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("DELETE without a token: %v %v", resp, err)
	}
	if ms, err := follower.client.ListMirrors(context.Background()); err != nil || len(ms) != 1 {
		t.Fatalf("the mirror after an unauthenticated DELETE: %v %v", ms, err)
	}

	// A member whose raft certificate comes from another CA: raft refuses
	// it both ways, and `members` says why next to its row (it never
	// joins). A non-voter, so the quorum does not count it.
	other, err := harness.NewCA("not-the-members-ca")
	if err != nil {
		t.Fatal(err)
	}
	oiss, err := other.Issue(harness.CertOptions{CommonName: "kmirror-member", IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	httpAddr, raftAddr := freeAddr(t), freeAddr(t)
	if err := follower.client.AddMember(context.Background(), api.AddMemberRequest{ID: "sg-4", RaftAddr: raftAddr, HTTPAddr: httpAddr, NonVoter: true}); err != nil {
		t.Fatal(err)
	}
	startMember(t, "sg-4", memberOpts{
		extra: fmt.Sprintf(`api:
  tls: {cert_file: %[1]s, key_file: %[2]s, ca_file: %[3]s}
  token_file: %[4]s
raft_tls: {cert_file: %[5]s, key_file: %[6]s, ca_file: %[7]s}
peers:
%[8]s  - {id: sg-4, raft: "%[9]s", http: "%[10]s"}
`, certFile, keyFile, caFile, tokenFile, write("other.pem", oiss.CertPEM), write("other-key.pem", oiss.KeyPEM), write("other-ca.pem", other.PEM),
			strings.Join(g.peers, ""), raftAddr, httpAddr),
		httpAddr: httpAddr, raftAddr: raftAddr, noWait: true, apiTLS: clientTLS, token: token})
	const why = "raft TLS handshake with member " // then x509's "certificate signed by unknown authority"
	var row api.MemberStatus
	for end := time.Now().Add(30 * time.Second); !strings.Contains(row.Error, why) || !strings.Contains(row.Error, "unknown authority"); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("members: sg-4 (a raft certificate from another CA) shows %+v after 30s; want not started, its error naming the TLS handshake", row)
		}
		ms, err := follower.client.Members(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range ms {
			if r.ID == "sg-4" {
				row = r
			}
		}
	}
	if row.State != "not started" || row.Partitions != 0 {
		t.Fatalf("members: sg-4 %+v, want not started with no partitions", row)
	}
	if out, errOut, code := cliArgs(t, append(withAuth, "members")...); code != 0 || !strings.Contains(out, "sg-4: "+why) {
		t.Fatalf("kmirror members: exit %d, want the line \"sg-4: %s...\":\n%s%s", code, why, out, errOut)
	}
	if err := follower.client.RemoveMember(context.Background(), "sg-4"); err != nil {
		t.Fatal(err)
	}
}

// leaderIs reports whether m is the raft leader.
func leaderIs(t *testing.T, m *member) bool {
	t.Helper()
	ms, err := m.client.Members(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range ms {
		if x.Role == "leader" {
			return strings.HasSuffix(m.url, x.HTTPAddr)
		}
	}
	return false
}
