package integration

import (
	"context"
	"crypto/pbkdf2"
	"crypto/sha512"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kmirror/kmirror/integration/harness"
)

// The security tests' fixtures: clusters with TLS, SASL and ACLs, a CA and
// its certificates, secured members, and checks of what they show.

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
