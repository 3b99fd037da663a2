package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/integration/harness"
)

// TestSecurity runs the security cases on one pair of secure clusters,
// started once for them.
func TestSecurity(t *testing.T) {
	s := startSecure(t)
	for _, user := range []string{scram512User, scram256User, plainUser} {
		setACLs(t, s.src, "User:"+user, true, sourceACLs("sec-", "sec-"))
	}
	setACLs(t, s.dst, destPrincipal, true, destinationACLs("sec-", "sec-"))
	secrets := s.write(t, "secrets.properties", []byte(fmt.Sprintf("scram512=%s\nscram256=%s\nplain=%s\n",
		scram512Password, scram256Password, plainPassword)))
	m := s.member(t, "secure")
	ctx := context.Background()
	// m256 reads its own copy of the truststore, which UnknownCA swaps.
	trust256 := s.write(t, "ca-m256.pem", s.ca.PEM)
	// mplain holds its password literally, so the display tests see a
	// secret in the properties themselves.
	mirrors := []securityMirror{
		{"m512", "SCRAM-SHA-512", scramModule, scram512User, "${file:" + secrets + ":scram512}", s.caFile, "sec-512"},
		{"m256", "SCRAM-SHA-256", scramModule, scram256User, "${file:" + secrets + ":scram256}", trust256, "sec-256"},
		{"mplain", "PLAIN", plainModule, plainUser, plainPassword, s.caFile, "sec-plain"},
	}
	r := &securityRun{s: s, m: m, ctx: ctx, mirrors: mirrors}
	t.Run("MechanismsRecordByRecord", r.mechanismsRecordByRecord)
	t.Run("WrongPassword", r.wrongPassword)
	t.Run("UnknownCA", r.unknownCA)
	t.Run("ExpiredCertificate", r.expiredCertificate)
	t.Run("WrongHostName", r.wrongHostName)
	t.Run("MissingACL", r.missingACL)
	t.Run("ReadOnlyMirrorTopics", r.readOnlyMirrorTopics)
	t.Run("StopFence", r.stopFence)
	t.Run("SecretsNeverShown", r.secretsNeverShown)
}

// securityRun is what TestSecurity's cases share: the secure cluster
// pair, the member and the mirrors created in MechanismsRecordByRecord.
type securityRun struct {
	s       *secure
	m       *member
	ctx     context.Context
	mirrors []securityMirror
	shown   []string // every error text a case met, for SecretsNeverShown
}

// recovered waits until the mirror catches up after a fix and compares
// the topic record by record.
func (r *securityRun) recovered(t *testing.T, mirror, topic string) {
	t.Helper()
	waitCaughtUp(t, r.m, mirror, topic)
	requireSameRecords(t, readAll(t, r.s.src, topic, 3, true), readAll(t, r.s.dst, topic, 3, true))
}

// failedWith waits until every partition of the topic is FAILED with a
// reason holding each of want, and keeps the reasons for
// SecretsNeverShown.
func (r *securityRun) failedWith(t *testing.T, mirror, topic string, want ...string) {
	t.Helper()
	rows := waitAllStates(t, r.m, mirror, topic, "FAILED", want[0], 90*time.Second)
	for _, row := range rows {
		requireAll(t, row.Reason, want...)
		r.shown = append(r.shown, row.Reason)
	}
}

func (r *securityRun) mechanismsRecordByRecord(t *testing.T) {
	s, m, ctx, mirrors := r.s, r.m, r.ctx, r.mirrors
	for _, mr := range mirrors {
		if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: mr.name, Properties: s.mirrorProps(mr.mech, mr.module, mr.user, mr.password, mr.trust)}); err != nil {
			t.Fatalf("create mirror %s: %v", mr.name, err)
		}
		if err := s.src.CreateTopic(ctx, mr.topic, 3, 1, nil); err != nil {
			t.Fatal(err)
		}
		produceTo(t, s.src, mr.topic, 3, 300, mr.name)
		addCaughtUp(t, m, mr.name, mr.topic)
		produceTo(t, s.src, mr.topic, 3, 150, mr.name+"-live")
		waitCaughtUp(t, m, mr.name, mr.topic)
		requireSameRecords(t, readAll(t, s.src, mr.topic, 3, true), readAll(t, s.dst, mr.topic, 3, true))
	}
	// Group offsets sync through the least-privilege ACLs too.
	committed := map[int32]int64{0: 100, 1: 120, 2: 140}
	commitOn(t, s.src, "sec-group", "sec-512", committed)
	dstWant := waitGroupSynced(t, m, "m512", "sec-group", "sec-512", committed)
	if got := committedOn(t, s.dst, "sec-group", "sec-512"); fmt.Sprint(got) != fmt.Sprint(dstWant) {
		t.Fatalf("destination group commits %v, want %v", got, dstWant)
	}
}

func (r *securityRun) wrongPassword(t *testing.T) {
	s, m, ctx := r.s, r.m, r.ctx
	err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "bad",
		Properties: s.mirrorProps("SCRAM-SHA-512", scramModule, scram512User, "not-the-password", s.caFile)})
	requireErr(t, err, &r.shown, `kafka broker `+s.srcAddr+` refused user "kmirror512" with SASL mechanism SCRAM-SHA-512`,
		"check the username and password in sasl.jaas.config")
	// The operator rotates the password on the source: kmirror's
	// sessions end (KIP-368) and its new connections are refused.
	setSCRAMPassword(t, s.src, scram512User, rotatedPassword)
	produceTo(t, s.src, "sec-512", 3, 90, "rotated")
	r.failedWith(t, "m512", "sec-512", "source cluster of mirror m512", s.srcAddr, `refused user "kmirror512"`, "check the username and password in sasl.jaas.config")
	// Fixed with kmirror alter: the new password, by reference.
	rotated := s.write(t, "secrets-rotated.properties", []byte("scram512="+rotatedPassword+"\n"))
	props := s.mirrorProps("SCRAM-SHA-512", scramModule, scram512User, "${file:"+rotated+":scram512}", s.caFile)
	props["groups.sync.interval"] = "300ms"
	if err := m.client.AlterMirror(ctx, api.CreateMirrorRequest{Name: "m512", Properties: props}); err != nil {
		t.Fatalf("alter m512 with the rotated password: %v", err)
	}
	r.recovered(t, "m512", "sec-512")
}

func (r *securityRun) unknownCA(t *testing.T) {
	s, m, ctx := r.s, r.m, r.ctx
	other, err := harness.NewCA("another-ca")
	if err != nil {
		t.Fatal(err)
	}
	otherFile := s.write(t, "other-ca.pem", other.PEM)
	err = m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "bad",
		Properties: s.mirrorProps("SCRAM-SHA-256", scramModule, scram256User, scram256Password, otherFile)})
	requireErr(t, err, &r.shown, "TLS handshake with kafka broker "+s.srcAddr,
		"signed by an authority kmirror does not trust: put the CA certificate that signed it (PEM) in mirror bad's ssl.truststore.location")
	// The truststore file is replaced by the wrong CA: new connections
	// fail; putting the right CA back is the fix (files are read at
	// every connection).
	s.write(t, "ca-m256.pem", other.PEM)
	produceTo(t, s.src, "sec-256", 3, 90, "wrong-ca")
	r.failedWith(t, "m256", "sec-256", "source cluster of mirror m256", s.srcAddr, "signed by an authority kmirror does not trust")
	s.write(t, "ca-m256.pem", s.ca.PEM)
	r.recovered(t, "m256", "sec-256")
}

func (r *securityRun) expiredCertificate(t *testing.T) {
	s, m, ctx := r.s, r.m, r.ctx
	// The source requests client certificates: mplain presents one.
	good := s.issue(t, "mplain-client.pem", harness.CertOptions{CommonName: "kmirror-plain"})
	expiredIss, err := s.ca.Issue(harness.CertOptions{CommonName: "kmirror-plain", NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	expired, _ := expiredIss.WriteKeystore(filepath.Join(s.dir, "expired.pem"))
	props := s.mirrorProps("PLAIN", plainModule, plainUser, plainPassword, s.caFile)
	props["ssl.keystore.type"], props["ssl.keystore.location"] = "PEM", expired
	err = m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "bad", Properties: props})
	requireErr(t, err, &r.shown, "ssl.keystore.location: kmirror's certificate CN=kmirror-plain is valid from", "not now: renew it")
	props["ssl.keystore.location"] = good
	props["groups.sync.interval"] = "300ms"
	if err := m.client.AlterMirror(ctx, api.CreateMirrorRequest{Name: "mplain", Properties: props}); err != nil {
		t.Fatalf("alter mplain with a client certificate: %v", err)
	}
	// The altered mirror runs on connections made with the good
	// certificate before the file changes (else the alter's new
	// connections and the file change race).
	produceTo(t, s.src, "sec-plain", 3, 30, "client-cert")
	waitCaughtUp(t, m, "mplain", "sec-plain")
	// The certificate file is replaced by an expired one. Connections made
	// before keep working (the broker checked the certificate when they
	// were made, as for Kafka's own clients); the next ones fail, here
	// all of them as the member restarts.
	data, _ := os.ReadFile(good)
	replaceFile(t, good, append(append([]byte(nil), expiredIss.KeyPEM...), expiredIss.CertPEM...))
	// Put the good certificate back even if this subtest fails, so the
	// later ones do not inherit the expired one.
	restored := false
	defer func() {
		if !restored {
			replaceFile(t, good, data)
		}
	}()
	m.stop()
	m.start()
	produceTo(t, s.src, "sec-plain", 3, 90, "expired")
	r.failedWith(t, "mplain", "sec-plain", "source cluster of mirror mplain", "kmirror's certificate CN=kmirror-plain is valid from", "renew it")
	replaceFile(t, good, data)
	restored = true
	r.recovered(t, "mplain", "sec-plain")
}

func (r *securityRun) wrongHostName(t *testing.T) {
	s, m, ctx := r.s, r.m, r.ctx
	_, port, _ := net.SplitHostPort(s.srcAddr)
	props := s.mirrorProps("SCRAM-SHA-512", scramModule, scram512User, rotatedPassword, s.caFile)
	props["bootstrap.servers"] = "localhost:" + port
	err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "bad", Properties: props})
	requireErr(t, err, &r.shown, "TLS handshake with kafka broker localhost:"+port, `not valid for "localhost"`,
		"ssl.endpoint.identification.algorithm= (empty) to skip the host-name check")
	// With the host-name check off the chain is still checked, and the
	// mirror is created.
	props["ssl.endpoint.identification.algorithm"] = ""
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "nohostcheck", Properties: props}); err != nil {
		t.Fatalf("create with ssl.endpoint.identification.algorithm empty: %v", err)
	}
	if err := m.client.DeleteMirror(ctx, "nohostcheck", false); err != nil {
		t.Fatal(err)
	}
}

func (r *securityRun) missingACL(t *testing.T) {
	s := r.s
	read := []aclSpec{{kmsg.ACLResourceTypeTopic, "sec-", kmsg.ACLResourcePatternTypePrefixed, kmsg.ACLOperationRead}}
	setACLs(t, s.src, "User:"+scram512User, false, read)
	produceTo(t, s.src, "sec-512", 3, 90, "no-acl")
	r.failedWith(t, "m512", "sec-512", "source cluster of mirror m512", s.srcAddr, "Topic Authorization Failed",
		"grant the ACLs the README lists (Least-privilege ACLs)")
	setACLs(t, s.src, "User:"+scram512User, true, read)
	r.recovered(t, "m512", "sec-512")
}

func (r *securityRun) readOnlyMirrorTopics(t *testing.T) {
	s, m, ctx := r.s, r.m, r.ctx
	// An application allowed to write the sec- topics on the
	// destination, authenticated by its own client certificate.
	setACLs(t, s.dst, "User:CN=app", true, []aclSpec{
		{kmsg.ACLResourceTypeTopic, "sec-", kmsg.ACLResourcePatternTypePrefixed, kmsg.ACLOperationWrite}})
	appKeystore := s.issue(t, "app.pem", harness.CertOptions{CommonName: "app"})
	cert, err := tls.LoadX509KeyPair(appKeystore, appKeystore)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(s.ca.Cert)
	app, err := kgo.NewClient(kgo.SeedBrokers(s.dstAddr), kgo.DialTLSConfig(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}),
		kgo.RequestRetries(0), kgo.RecordRetries(1), kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	appWrite := func(topic string) error {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return app.ProduceSync(pctx, &kgo.Record{Topic: topic, Value: []byte("from the app")}).FirstErr()
	}
	waitDenied := func(topic string, want bool) { t.Helper(); r.waitAppDenied(t, topic, want) }
	appDeny := aclSpec{kmsg.ACLResourceTypeTopic, "sec-plain", kmsg.ACLResourcePatternTypeLiteral, kmsg.ACLOperationWrite}
	waitDenied("sec-plain", true)
	// The record comes first (a crash after it leaves a harmless record),
	// the broker enforces the DENY once the metadata reached it: write
	// only when the broker lists it (a write before that lands, and the
	// partition goes DIVERGED, as it should).
	for deadline := time.Now().Add(30 * time.Second); !hasDenyACL(t, s.dst, "User:CN=app", appDeny); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("kmirror recorded a DENY WRITE for the app on sec-plain, but the broker did not list it within 30s:\n%s", m.logTail())
		}
	}
	if err := appWrite("sec-plain"); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("the app wrote into a MIRRORING topic: %v", err)
	}
	if strings.Contains(m.logAll(), "were deleted by someone") {
		t.Fatalf("warned that a DENY was deleted before anyone deleted one:\n%s", m.logTail())
	}
	// A DENY missing within 3 s of its creation is taken for ACL
	// propagation (put back without a warning): delete it later than that.
	time.Sleep(3 * time.Second)
	// Someone deletes kmirror's DENY: the next round puts it back.
	if n := deleteDenyACL(t, s.dst, "User:CN=app", appDeny); n != 1 {
		t.Fatalf("deleted %d DENY ACLs for the app on sec-plain, want kmirror's one", n)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !hasDenyACL(t, s.dst, "User:CN=app", appDeny) || !strings.Contains(m.logAll(), "were deleted by someone; added again") {
		if time.Now().After(deadline) {
			t.Fatalf("the deleted DENY WRITE was not put back with a warning within 30s (put back: %t):\n%s",
				hasDenyACL(t, s.dst, "User:CN=app", appDeny), m.logTail())
		}
		time.Sleep(200 * time.Millisecond)
	}
	// kmirror itself still writes (its own principal is not denied).
	produceTo(t, s.src, "sec-plain", 3, 60, "read-only")
	r.recovered(t, "mplain", "sec-plain")
	// Failover: the topic is STOPPED and writable again when remove
	// returns (no wait: an application is cut over at that moment).
	if err := m.client.RemoveTopic(ctx, "mplain", "sec-plain"); err != nil {
		t.Fatal(err)
	}
	if hasDenyACL(t, s.dst, "User:CN=app", appDeny) {
		t.Fatal("remove returned while kmirror's DENY WRITE on sec-plain still exists")
	}
	waitDenied("sec-plain", false)
	if err := appWrite("sec-plain"); err != nil {
		t.Fatalf("the app cannot write the failed-over topic: %v", err)
	}
	if !strings.Contains(m.logAll(), "DENY WRITE ACLs removed") {
		t.Fatalf("no log of the lifted denial:\n%s", m.logTail())
	}
	// A failover whose DENY kmirror may not delete (its ALTER on the
	// cluster revoked): the topic stays read-only for the app, which
	// is an outage, so it is counted and logged with the fix; once
	// ALTER is back the next round lifts it.
	clusterAlter := []aclSpec{{kmsg.ACLResourceTypeCluster, "kafka-cluster", kmsg.ACLResourcePatternTypeLiteral, kmsg.ACLOperationAlter}}
	waitDenied("sec-256", true)
	setACLs(t, s.dst, destPrincipal, false, clusterAlter)
	if err := m.client.RemoveTopic(ctx, "m256", "sec-256"); err != nil {
		t.Fatal(err)
	}
	waitMetric := func(line string) {
		t.Helper()
		for end := time.Now().Add(30 * time.Second); !strings.Contains(metricsText(t, m), line); time.Sleep(200 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("/metrics has no %q after 30s:\n%s\n%s", line, metricsText(t, m), m.logTail())
			}
		}
	}
	waitMetric("kmirror_read_only_unlifted_topics 1")
	if err := appWrite("sec-256"); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("the app wrote sec-256 though kmirror could not delete its DENY: %v", err)
	}
	if log := m.logAll(); !strings.Contains(log, "failed-over or removed topics sec-256 are still read-only") ||
		!strings.Contains(log, "to make them writable again") {
		t.Fatalf("no warning naming sec-256 and the fix:\n%s", log)
	}
	setACLs(t, s.dst, destPrincipal, true, clusterAlter)
	waitMetric("kmirror_read_only_unlifted_topics 0")
	waitDenied("sec-256", false)
	if err := appWrite("sec-256"); err != nil {
		t.Fatalf("the app cannot write sec-256 once its DENY is lifted: %v", err)
	}
}

// stopFence: a removed (failed-over) topic gets a DENY WRITE for
// kmirror's own principal, so a produce request of kmirror's that the
// network delivers after the stop is refused by the broker (issue 19);
// an add of the topic lifts it, and mirroring continues record by record.
func (r *securityRun) stopFence(t *testing.T) {
	s, m, ctx := r.s, r.m, r.ctx
	const topic = "sec-fence"
	if err := s.src.CreateTopic(ctx, topic, 3, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceTo(t, s.src, topic, 3, 90, "before")
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "mplain", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	r.recovered(t, "mplain", topic)
	if err := m.client.RemoveTopic(ctx, "mplain", topic); err != nil {
		t.Fatal(err)
	}
	own := aclSpec{kmsg.ACLResourceTypeTopic, topic, kmsg.ACLResourcePatternTypeLiteral, kmsg.ACLOperationWrite}
	if !hasDenyACL(t, s.dst, destPrincipal, own) {
		t.Fatalf("remove returned without the DENY WRITE for kmirror's own principal on %s:\n%s", topic, m.logTail())
	}
	// A late produce request of kmirror's: its principal, refused.
	cert, err := tls.LoadX509KeyPair(s.kmirrorKeystore, s.kmirrorKeystore)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(s.ca.Cert)
	late, err := kgo.NewClient(kgo.SeedBrokers(s.dstAddr), kgo.DialTLSConfig(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}),
		kgo.RequestRetries(0), kgo.RecordRetries(1), kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = late.ProduceSync(pctx, &kgo.Record{Topic: topic, Value: []byte("late kmirror batch")}).FirstErr()
	cancel()
	if !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("a produce with kmirror's principal into the stopped topic: %v, want TOPIC_AUTHORIZATION_FAILED", err)
	}
	// Added again: the fence goes first, then kmirror mirrors on. (An
	// add of a removed topic looks for a last mirrored position on the
	// source, for failback: README, Least-privilege ACLs.)
	setACLs(t, s.src, "User:"+plainUser, true, []aclSpec{
		{kmsg.ACLResourceTypeTopic, "__kmirror_state", kmsg.ACLResourcePatternTypeLiteral, kmsg.ACLOperationRead},
		{kmsg.ACLResourceTypeTopic, "__kmirror_state", kmsg.ACLResourcePatternTypeLiteral, kmsg.ACLOperationDescribe}})
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "mplain", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	if hasDenyACL(t, s.dst, destPrincipal, own) {
		t.Fatalf("add returned with the stop fence still on %s", topic)
	}
	produceTo(t, s.src, topic, 3, 90, "after")
	r.recovered(t, "mplain", topic)
}

func (r *securityRun) secretsNeverShown(t *testing.T) {
	s, m := r.s, r.m
	var texts []string
	for _, args := range [][]string{{"list"}, {"--output", "json", "list"}, {"describe"}, {"--output", "json", "describe"}, {"describe", "--groups"}} {
		out, errOut, code := cli(t, m, args...)
		if code != 0 {
			t.Fatalf("kmirror %v: exit %d: %s", args, code, errOut)
		}
		texts = append(texts, out+errOut)
	}
	if list, _, _ := cli(t, m, "--output", "json", "list"); !strings.Contains(list, `password=\"[hidden]\"`) || !strings.Contains(list, `username=\"`+plainUser+`\"`) {
		t.Fatalf("list does not show mplain's sasl.jaas.config with the password hidden:\n%s", list)
	}
	for _, path := range []string{"/metrics", "/v1/mirrors"} {
		texts = append(texts, httpGet(t, m.httpc, m.url+path))
	}
	log, err := os.ReadFile(m.logPath)
	if err != nil {
		t.Fatal(err)
	}
	texts = append(texts, string(log))
	texts = append(texts, r.shown...)
	key, _ := os.ReadFile(s.kmirrorKeystore)
	keyBody := strings.Split(string(key), "\n")[1] // a line of the private key's base64
	for _, secret := range []string{scram512Password, rotatedPassword, scram256Password, plainPassword, "not-the-password", keyBody} {
		for i, text := range texts {
			if strings.Contains(text, secret) {
				t.Errorf("output %d shows the secret %q:\n%s", i, secret, text)
			}
		}
	}
}

// waitAppDenied waits until kmirror's record of the DENY WRITE for
// User:CN=app on topic is want.
func (r *securityRun) waitAppDenied(t *testing.T, topic string, want bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ms, err := r.m.client.ListMirrors(r.ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := false
		for _, mir := range ms {
			got = got || slices.Contains(mir.WriteDenied[topic], "User:CN=app")
		}
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: User:CN=app denied = %v after 30s, want %v: %+v\n%s", topic, got, want, ms, r.m.logTail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// securityMirror is one of TestSecurity's mirrors: its SASL mechanism and
// login module, user and password (a ${file:...} reference or literal),
// truststore and topic.
type securityMirror struct{ name, mech, module, user, password, trust, topic string }
