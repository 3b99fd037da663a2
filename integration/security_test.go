package integration

import (
	"context"
	"crypto/pbkdf2"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
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

// secure is a source cluster with a SASL_SSL listener (PLAIN,
// SCRAM-SHA-256, SCRAM-SHA-512; client certificates requested) and a
// destination with an SSL listener that requires client certificates (mTLS),
// both with StandardAuthorizer and no ACL allowing anything by default. The
// harness and the checks use each cluster's PLAINTEXT listener, whose
// principal (User:ANONYMOUS) is a super user; kmirror uses only the secure
// listeners, as the least-privilege principals of the README.
type secure struct {
	dir      string
	ca       *harness.CA
	src, dst *harness.Cluster
	srcAddr  string // SASL_SSL listener of the source broker
	dstAddr  string // SSL listener of the destination broker
	caFile   string // the CA's certificate (truststore)
	// kmirrorKeystore is kmirror's client key and certificate (CN=kmirror,
	// principal User:CN=kmirror on the destination).
	kmirrorKeystore string
}

// SCRAM and PLAIN users of the source, and their passwords.
const (
	scram512User, scram512Password = "kmirror512", "scram-512-secret-Xq7"
	scram256User, scram256Password = "kmirror256", "scram-256-secret-Yw3"
	plainUser, plainPassword       = "kmirrorplain", "plain-secret-Zr9"
	destPrincipal                  = "User:CN=kmirror"
)

// authorizerProps turn on ACLs: nothing is allowed unless an ACL allows it,
// except for the PLAINTEXT listener's ANONYMOUS principal (the brokers
// themselves, the harness, Kafka's tools).
var authorizerProps = map[string]string{
	"authorizer.class.name":          "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
	"super.users":                    "User:ANONYMOUS",
	"allow.everyone.if.no.acl.found": "false",
}

func startSecure(t *testing.T) *secure {
	t.Helper()
	s := &secure{dir: t.TempDir()}
	var err error
	if s.ca, err = harness.NewCA("kmirror-test-ca"); err != nil {
		t.Fatal(err)
	}
	s.caFile = s.write(t, "ca.pem", s.ca.PEM)
	loopback := []net.IP{net.ParseIP("127.0.0.1")}
	s.kmirrorKeystore = s.issue(t, "kmirror.pem", harness.CertOptions{CommonName: "kmirror"})
	srcKeystore := s.issue(t, "source-broker.pem", harness.CertOptions{CommonName: "source-broker", IPs: loopback})
	dstKeystore := s.issue(t, "destination-broker.pem", harness.CertOptions{CommonName: "destination-broker", IPs: loopback})

	srcProps := map[string]string{
		"sasl.enabled.mechanisms":                        "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
		"listener.name.sasl_ssl.ssl.keystore.type":       "PEM",
		"listener.name.sasl_ssl.ssl.keystore.location":   srcKeystore,
		"listener.name.sasl_ssl.ssl.truststore.type":     "PEM",
		"listener.name.sasl_ssl.ssl.truststore.location": s.caFile,
		"listener.name.sasl_ssl.ssl.client.auth":         "requested",
		"listener.name.sasl_ssl.plain.sasl.jaas.config": fmt.Sprintf(
			`org.apache.kafka.common.security.plain.PlainLoginModule required user_%s="%s";`, plainUser, plainPassword),
		"listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required;",
		"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required;",
		// KIP-368: the broker ends a SASL session after 3 s; a client that
		// does not re-authenticate (kmirror) has the connection closed and
		// dials anew, reading its secret files again.
		"connections.max.reauth.ms": "3000",
	}
	dstProps := map[string]string{
		"listener.name.ssl.ssl.keystore.type":       "PEM",
		"listener.name.ssl.ssl.keystore.location":   dstKeystore,
		"listener.name.ssl.ssl.truststore.type":     "PEM",
		"listener.name.ssl.ssl.truststore.location": s.caFile,
		"listener.name.ssl.ssl.client.auth":         "required",
	}
	for k, v := range authorizerProps {
		srcProps[k], dstProps[k] = v, v
	}
	ctx := context.Background()
	s.src, err = harness.Start(ctx, harness.Options{Name: "secure-source", Listeners: []string{"SASL_SSL"}, BrokerProps: srcProps,
		FormatArgs: []string{
			"--add-scram", fmt.Sprintf("SCRAM-SHA-512=[name=%s,password=%s]", scram512User, scram512Password),
			"--add-scram", fmt.Sprintf("SCRAM-SHA-256=[name=%s,password=%s]", scram256User, scram256Password),
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.src.Close() })
	s.dst, err = harness.Start(ctx, harness.Options{Name: "secure-destination", Listeners: []string{"SSL"}, BrokerProps: dstProps})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.dst.Close() })
	s.srcAddr, s.dstAddr = s.src.ListenerAddrs("SASL_SSL")[0], s.dst.ListenerAddrs("SSL")[0]
	return s
}

func (s *secure) write(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(s.dir, name)
	replaceFile(t, path, data)
	return path
}

// replaceFile writes path whole at once (a new file renamed over it), as
// an operator's tooling replaces a certificate or secret: kmirror reads
// these files at every connection and must never see one half-written.
func replaceFile(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func (s *secure) issue(t *testing.T, name string, o harness.CertOptions) string {
	t.Helper()
	iss, err := s.ca.Issue(o)
	if err != nil {
		t.Fatal(err)
	}
	path, err := iss.WriteKeystore(filepath.Join(s.dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// aclSpec is one ALLOW ACL.
type aclSpec struct {
	resource kmsg.ACLResourceType
	name     string
	pattern  kmsg.ACLResourcePatternType
	op       kmsg.ACLOperation
}

// sourceACLs are what kmirror needs on a source cluster (README,
// "Least-privilege ACLs"): READ, DESCRIBE and DESCRIBE_CONFIGS on the
// mirrored topics, DESCRIBE on the groups it syncs.
func sourceACLs(topicPrefix, groupPrefix string) []aclSpec {
	return []aclSpec{
		{kmsg.ACLResourceTypeTopic, topicPrefix, kmsg.ACLResourcePatternTypePrefixed, kmsg.ACLOperationRead},
		{kmsg.ACLResourceTypeTopic, topicPrefix, kmsg.ACLResourcePatternTypePrefixed, kmsg.ACLOperationDescribe},
		{kmsg.ACLResourceTypeTopic, topicPrefix, kmsg.ACLResourcePatternTypePrefixed, kmsg.ACLOperationDescribeConfigs},
		{kmsg.ACLResourceTypeGroup, groupPrefix, kmsg.ACLResourcePatternTypePrefixed, kmsg.ACLOperationDescribe},
	}
}

// destinationACLs are what kmirror needs on the destination cluster
// (README, "Least-privilege ACLs"); READ and WRITE imply DESCRIBE.
func destinationACLs(topicPrefix, groupPrefix string) []aclSpec {
	var out []aclSpec
	for _, op := range []kmsg.ACLOperation{kmsg.ACLOperationCreate, kmsg.ACLOperationWrite, kmsg.ACLOperationRead} {
		out = append(out, aclSpec{kmsg.ACLResourceTypeTopic, "__kmirror", kmsg.ACLResourcePatternTypePrefixed, op})
	}
	for _, op := range []kmsg.ACLOperation{kmsg.ACLOperationCreate, kmsg.ACLOperationWrite, kmsg.ACLOperationRead,
		kmsg.ACLOperationDescribeConfigs, kmsg.ACLOperationAlterConfigs, kmsg.ACLOperationAlter, kmsg.ACLOperationDelete} {
		out = append(out, aclSpec{kmsg.ACLResourceTypeTopic, topicPrefix, kmsg.ACLResourcePatternTypePrefixed, op})
	}
	out = append(out, aclSpec{kmsg.ACLResourceTypeGroup, groupPrefix, kmsg.ACLResourcePatternTypePrefixed, kmsg.ACLOperationRead})
	// Read-only mirror topics: reading and managing ACLs.
	for _, op := range []kmsg.ACLOperation{kmsg.ACLOperationDescribe, kmsg.ACLOperationAlter} {
		out = append(out, aclSpec{kmsg.ACLResourceTypeCluster, "kafka-cluster", kmsg.ACLResourcePatternTypeLiteral, op})
	}
	return out
}

// setACLs creates (add) or deletes ALLOW ACLs for principal on cl.
func setACLs(t *testing.T, cl *harness.Cluster, principal string, add bool, acls []aclSpec) {
	t.Helper()
	if add {
		req := kmsg.NewPtrCreateACLsRequest()
		for _, a := range acls {
			c := kmsg.NewCreateACLsRequestCreation()
			c.ResourceType, c.ResourceName, c.ResourcePatternType = a.resource, a.name, a.pattern
			c.Principal, c.Host, c.Operation, c.PermissionType = principal, "*", a.op, kmsg.ACLPermissionTypeAllow
			req.Creations = append(req.Creations, c)
		}
		for _, r := range adminRequest(t, cl, req).(*kmsg.CreateACLsResponse).Results {
			if r.ErrorCode != 0 {
				t.Fatalf("create ACL: error %d %v", r.ErrorCode, r.ErrorMessage)
			}
		}
		return
	}
	req := kmsg.NewPtrDeleteACLsRequest()
	for _, a := range acls {
		f := kmsg.NewDeleteACLsRequestFilter()
		f.ResourceType, f.ResourceName, f.ResourcePatternType = a.resource, kmsg.StringPtr(a.name), a.pattern
		f.Principal, f.Host, f.Operation, f.PermissionType = kmsg.StringPtr(principal), kmsg.StringPtr("*"), a.op, kmsg.ACLPermissionTypeAllow
		req.Filters = append(req.Filters, f)
	}
	for _, r := range adminRequest(t, cl, req).(*kmsg.DeleteACLsResponse).Results {
		if r.ErrorCode != 0 {
			t.Fatalf("delete ACL: error %d %v", r.ErrorCode, r.ErrorMessage)
		}
	}
}

// secureMember starts a member whose destination is the mTLS listener.
func (s *secure) member(t *testing.T, name string) *member {
	t.Helper()
	m := startMember(t, name, memberOpts{destination: s.dstAddr, destExtra: fmt.Sprintf(`  security.protocol: SSL
  ssl.truststore.type: PEM
  ssl.truststore.location: %s
  ssl.keystore.type: PEM
  ssl.keystore.location: %s
`, s.caFile, s.kmirrorKeystore)})
	m.src = s.src
	return m
}

// mirrorProps are mirror properties for the SASL_SSL source; password is
// the password or a reference to it, trust the truststore file.
func (s *secure) mirrorProps(mech, module, user, password, trust string) map[string]string {
	return map[string]string{
		"bootstrap.servers":       s.srcAddr,
		"security.protocol":       "SASL_SSL",
		"ssl.truststore.type":     "PEM",
		"ssl.truststore.location": trust,
		"sasl.mechanism":          mech,
		"sasl.jaas.config":        fmt.Sprintf(`%s required username="%s" password="%s";`, module, user, password),
		"groups.sync.interval":    "300ms",
	}
}

const (
	scramModule = "org.apache.kafka.common.security.scram.ScramLoginModule"
	plainModule = "org.apache.kafka.common.security.plain.PlainLoginModule"
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
	mirrors := []struct{ name, mech, module, user, password, trust, topic string }{
		{"m512", "SCRAM-SHA-512", scramModule, scram512User, "${file:" + secrets + ":scram512}", s.caFile, "sec-512"},
		{"m256", "SCRAM-SHA-256", scramModule, scram256User, "${file:" + secrets + ":scram256}", trust256, "sec-256"},
		{"mplain", "PLAIN", plainModule, plainUser, plainPassword, s.caFile, "sec-plain"},
	}
	t.Run("MechanismsRecordByRecord", func(t *testing.T) {
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
	})
	var shown []string // every error text a case met, for SecretsNeverShown
	// recovered produces while broken, waits until the mirror catches up
	// after the fix and compares the topic record by record.
	recovered := func(t *testing.T, mirror, topic string) {
		t.Helper()
		waitCaughtUp(t, m, mirror, topic)
		requireSameRecords(t, readAll(t, s.src, topic, 3, true), readAll(t, s.dst, topic, 3, true))
	}
	failedWith := func(t *testing.T, mirror, topic string, want ...string) {
		t.Helper()
		rows := waitAllStates(t, m, mirror, topic, "FAILED", want[0], 90*time.Second)
		for _, r := range rows {
			requireAll(t, r.Reason, want...)
			shown = append(shown, r.Reason)
		}
	}
	t.Run("WrongPassword", func(t *testing.T) {
		err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "bad",
			Properties: s.mirrorProps("SCRAM-SHA-512", scramModule, scram512User, "not-the-password", s.caFile)})
		requireErr(t, err, &shown, `kafka broker `+s.srcAddr+` refused user "kmirror512" with SASL mechanism SCRAM-SHA-512`,
			"check the username and password in sasl.jaas.config")
		// The operator rotates the password on the source: kmirror's
		// sessions end (KIP-368) and its new connections are refused.
		setSCRAMPassword(t, s.src, scram512User, rotatedPassword)
		produceTo(t, s.src, "sec-512", 3, 90, "rotated")
		failedWith(t, "m512", "sec-512", "source cluster of mirror m512", s.srcAddr, `refused user "kmirror512"`, "check the username and password in sasl.jaas.config")
		// Fixed with kmirror alter: the new password, by reference.
		rotated := s.write(t, "secrets-rotated.properties", []byte("scram512="+rotatedPassword+"\n"))
		props := s.mirrorProps("SCRAM-SHA-512", scramModule, scram512User, "${file:"+rotated+":scram512}", s.caFile)
		props["groups.sync.interval"] = "300ms"
		if err := m.client.AlterMirror(ctx, api.CreateMirrorRequest{Name: "m512", Properties: props}); err != nil {
			t.Fatalf("alter m512 with the rotated password: %v", err)
		}
		recovered(t, "m512", "sec-512")
	})
	t.Run("UnknownCA", func(t *testing.T) {
		other, err := harness.NewCA("another-ca")
		if err != nil {
			t.Fatal(err)
		}
		otherFile := s.write(t, "other-ca.pem", other.PEM)
		err = m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "bad",
			Properties: s.mirrorProps("SCRAM-SHA-256", scramModule, scram256User, scram256Password, otherFile)})
		requireErr(t, err, &shown, "TLS handshake with kafka broker "+s.srcAddr,
			"signed by an authority kmirror does not trust: put the CA certificate that signed it (PEM) in mirror bad's ssl.truststore.location")
		// The truststore file is replaced by the wrong CA: new connections
		// fail; putting the right CA back is the fix (files are read at
		// every connection).
		s.write(t, "ca-m256.pem", other.PEM)
		produceTo(t, s.src, "sec-256", 3, 90, "wrong-ca")
		failedWith(t, "m256", "sec-256", "source cluster of mirror m256", s.srcAddr, "signed by an authority kmirror does not trust")
		s.write(t, "ca-m256.pem", s.ca.PEM)
		recovered(t, "m256", "sec-256")
	})
	t.Run("ExpiredCertificate", func(t *testing.T) {
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
		requireErr(t, err, &shown, "ssl.keystore.location: kmirror's certificate CN=kmirror-plain is valid from", "not now: renew it")
		props["ssl.keystore.location"] = good
		props["groups.sync.interval"] = "300ms"
		if err := m.client.AlterMirror(ctx, api.CreateMirrorRequest{Name: "mplain", Properties: props}); err != nil {
			t.Fatalf("alter mplain with a client certificate: %v", err)
		}
		// The certificate file is replaced by an expired one.
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
		produceTo(t, s.src, "sec-plain", 3, 90, "expired")
		failedWith(t, "mplain", "sec-plain", "source cluster of mirror mplain", "kmirror's certificate CN=kmirror-plain is valid from", "renew it")
		replaceFile(t, good, data)
		restored = true
		recovered(t, "mplain", "sec-plain")
	})
	t.Run("WrongHostName", func(t *testing.T) {
		_, port, _ := net.SplitHostPort(s.srcAddr)
		props := s.mirrorProps("SCRAM-SHA-512", scramModule, scram512User, rotatedPassword, s.caFile)
		props["bootstrap.servers"] = "localhost:" + port
		err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "bad", Properties: props})
		requireErr(t, err, &shown, "TLS handshake with kafka broker localhost:"+port, `not valid for "localhost"`,
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
	})
	t.Run("MissingACL", func(t *testing.T) {
		read := []aclSpec{{kmsg.ACLResourceTypeTopic, "sec-", kmsg.ACLResourcePatternTypePrefixed, kmsg.ACLOperationRead}}
		setACLs(t, s.src, "User:"+scram512User, false, read)
		produceTo(t, s.src, "sec-512", 3, 90, "no-acl")
		failedWith(t, "m512", "sec-512", "source cluster of mirror m512", s.srcAddr, "Topic Authorization Failed",
			"grant the ACLs the README lists (Least-privilege ACLs)")
		setACLs(t, s.src, "User:"+scram512User, true, read)
		recovered(t, "m512", "sec-512")
	})
	t.Run("ReadOnlyMirrorTopics", func(t *testing.T) {
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
		waitDenied := func(topic string, want bool) {
			t.Helper()
			deadline := time.Now().Add(30 * time.Second)
			for {
				ms, err := m.client.ListMirrors(ctx)
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
					t.Fatalf("%s: User:CN=app denied = %v after 30s, want %v: %+v\n%s", topic, got, want, ms, m.logTail())
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		waitDenied("sec-plain", true)
		if err := appWrite("sec-plain"); !errors.Is(err, kerr.TopicAuthorizationFailed) {
			t.Fatalf("the app wrote into a MIRRORING topic: %v", err)
		}
		// Someone deletes kmirror's DENY: the next round puts it back.
		appDeny := aclSpec{kmsg.ACLResourceTypeTopic, "sec-plain", kmsg.ACLResourcePatternTypeLiteral, kmsg.ACLOperationWrite}
		if n := deleteDenyACL(t, s.dst, "User:CN=app", appDeny); n != 1 {
			t.Fatalf("deleted %d DENY ACLs for the app on sec-plain, want kmirror's one", n)
		}
		deadline := time.Now().Add(30 * time.Second)
		for !hasDenyACL(t, s.dst, "User:CN=app", appDeny) {
			if time.Now().After(deadline) {
				t.Fatalf("the deleted DENY WRITE was not put back within 30s:\n%s", m.logTail())
			}
			time.Sleep(200 * time.Millisecond)
		}
		if !strings.Contains(m.logTail(), "were deleted by someone; added again") {
			t.Fatalf("no warning that a deleted DENY was put back:\n%s", m.logTail())
		}
		// kmirror itself still writes (its own principal is not denied).
		produceTo(t, s.src, "sec-plain", 3, 60, "read-only")
		recovered(t, "mplain", "sec-plain")
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
		if !strings.Contains(m.logTail(), "DENY WRITE ACLs removed") {
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
		if log := m.logTail(); !strings.Contains(log, "failed-over or removed topics sec-256 are still read-only") ||
			!strings.Contains(log, "to make them writable again") {
			t.Fatalf("no warning naming sec-256 and the fix:\n%s", log)
		}
		setACLs(t, s.dst, destPrincipal, true, clusterAlter)
		waitMetric("kmirror_read_only_unlifted_topics 0")
		waitDenied("sec-256", false)
		if err := appWrite("sec-256"); err != nil {
			t.Fatalf("the app cannot write sec-256 once its DENY is lifted: %v", err)
		}
	})
	t.Run("SecretsNeverShown", func(t *testing.T) {
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
		texts = append(texts, shown...)
		key, _ := os.ReadFile(s.kmirrorKeystore)
		keyBody := strings.Split(string(key), "\n")[1] // a line of the private key's base64
		for _, secret := range []string{scram512Password, rotatedPassword, scram256Password, plainPassword, "not-the-password", keyBody} {
			for i, text := range texts {
				if strings.Contains(text, secret) {
					t.Errorf("output %d shows the secret %q:\n%s", i, secret, text)
				}
			}
		}
	})
}

// httpGet returns the body of a GET.
func httpGet(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// rotatedPassword is kmirror512's password after WrongPassword rotates it.
const rotatedPassword = "scram-512-rotated-Kp2"

// requireAll fails unless text holds every wanted part.
func requireAll(t *testing.T, text string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Fatalf("%q\ndoes not say %q", text, w)
		}
	}
}

// requireErr requires an error that says every wanted part, and keeps its
// text.
func requireErr(t *testing.T, err error, shown *[]string, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want one saying %q", want)
	}
	requireAll(t, err.Error(), want...)
	*shown = append(*shown, err.Error())
}

// setSCRAMPassword sets a user's SCRAM-SHA-512 password through
// AlterUserScramCredentials (KIP-554), as kafka-configs --alter does.
func setSCRAMPassword(t *testing.T, cl *harness.Cluster, user, password string) {
	t.Helper()
	salt := make([]byte, 16)
	rand.Read(salt)
	const iterations = 4096
	salted, err := pbkdf2.Key(sha512.New, password, salt, iterations, sha512.Size)
	if err != nil {
		t.Fatal(err)
	}
	req := kmsg.NewPtrAlterUserSCRAMCredentialsRequest()
	u := kmsg.NewAlterUserSCRAMCredentialsRequestUpsertion()
	u.Name, u.Mechanism, u.Iterations, u.Salt, u.SaltedPassword = user, 2, iterations, salt, salted
	req.Upsertions = append(req.Upsertions, u)
	for _, r := range adminRequest(t, cl, req).(*kmsg.AlterUserSCRAMCredentialsResponse).Results {
		if r.ErrorCode != 0 {
			t.Fatalf("set SCRAM password of %s: error %d %v", user, r.ErrorCode, r.ErrorMessage)
		}
	}
}

// committedOn reads a group's committed offsets on cl.
func committedOn(t *testing.T, cl *harness.Cluster, group, topic string) map[int32]int64 {
	t.Helper()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic, rt.Partitions = topic, []int32{0, 1, 2}
	req.Topics = append(req.Topics, rt)
	out := map[int32]int64{}
	for _, tt := range adminRequest(t, cl, req).(*kmsg.OffsetFetchResponse).Topics {
		for _, p := range tt.Partitions {
			if p.Offset >= 0 {
				out[p.Partition] = p.Offset
			}
		}
	}
	return out
}

// deleteDenyACL deletes the DENY ACL a for principal and returns how many
// ACLs matched.
func deleteDenyACL(t *testing.T, cl *harness.Cluster, principal string, a aclSpec) int {
	t.Helper()
	req := kmsg.NewPtrDeleteACLsRequest()
	f := kmsg.NewDeleteACLsRequestFilter()
	f.ResourceType, f.ResourceName, f.ResourcePatternType = a.resource, kmsg.StringPtr(a.name), a.pattern
	f.Principal, f.Host, f.Operation, f.PermissionType = kmsg.StringPtr(principal), kmsg.StringPtr("*"), a.op, kmsg.ACLPermissionTypeDeny
	req.Filters = append(req.Filters, f)
	n := 0
	for _, r := range adminRequest(t, cl, req).(*kmsg.DeleteACLsResponse).Results {
		if r.ErrorCode != 0 {
			t.Fatalf("delete DENY ACL: error %d", r.ErrorCode)
		}
		n += len(r.MatchingACLs)
	}
	return n
}

// hasDenyACL reports whether the DENY ACL a for principal exists.
func hasDenyACL(t *testing.T, cl *harness.Cluster, principal string, a aclSpec) bool {
	t.Helper()
	req := kmsg.NewPtrDescribeACLsRequest()
	req.ResourceType, req.ResourceName, req.ResourcePatternType = a.resource, kmsg.StringPtr(a.name), a.pattern
	req.Principal, req.Host, req.Operation, req.PermissionType = kmsg.StringPtr(principal), kmsg.StringPtr("*"), a.op, kmsg.ACLPermissionTypeDeny
	res := adminRequest(t, cl, req).(*kmsg.DescribeACLsResponse)
	if res.ErrorCode != 0 {
		t.Fatalf("describe ACLs: error %d", res.ErrorCode)
	}
	for _, r := range res.Resources {
		if len(r.ACLs) > 0 {
			return true
		}
	}
	return false
}
