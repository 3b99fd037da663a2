package ksec

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kmirror/kmirror/integration/harness"
)

const secret = "s3cr3t-Pa55"

func jaas(module, user, pass string) string {
	return module + ` required username="` + user + `" password="` + pass + `";`
}

func TestParseErrorsNameThePropertyAndHideSecrets(t *testing.T) {
	cases := []struct {
		props map[string]string
		want  string
	}{
		{map[string]string{SecurityProtocol: "TLS"}, "security.protocol=TLS: use PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"},
		{map[string]string{SecurityProtocol: "SSL", TruststoreType: "JKS"}, "ssl.truststore.type=JKS: kmirror reads PEM stores only"},
		{map[string]string{SecurityProtocol: "SSL", TruststorePassword: secret}, "ssl.truststore.password is set: a PEM truststore has no password"},
		{map[string]string{SecurityProtocol: "SSL", KeystorePassword: secret}, "ssl.keystore.password is set: a PEM keystore has no store password"},
		{map[string]string{SecurityProtocol: "SASL_SSL", SASLMechanism: MechPlain, SASLJAASConfig: jaas(plainModule, "u", "[hidden]")},
			"sasl.jaas.config holds [hidden], which kmirror list shows in place of a secret"},
		{map[string]string{SecurityProtocol: "SSL", KeystoreKey: "/k.pem"}, "ssl.keystore.key and ssl.keystore.certificate.chain go together"},
		{map[string]string{SecurityProtocol: "SSL", KeyPassword: secret}, "ssl.key.password is set but no client key is"},
		{map[string]string{SecurityProtocol: "SSL", EndpointIdentification: "http"}, "use https"},
		{map[string]string{SecurityProtocol: "SSL", EnabledProtocols: "TLSv1.1"}, `"TLSv1.1" is not supported`},
		{map[string]string{SecurityProtocol: "SASL_SSL"}, "sasl.mechanism is not set"},
		{map[string]string{SecurityProtocol: "SASL_SSL", SASLMechanism: "GSSAPI", SASLJAASConfig: "x"}, "sasl.mechanism=GSSAPI is not supported"},
		{map[string]string{SecurityProtocol: "SASL_SSL", SASLMechanism: MechPlain}, "sasl.jaas.config is not set"},
		{map[string]string{SecurityProtocol: "SASL_SSL", SASLMechanism: MechPlain, SASLJAASConfig: jaas(scramModule, "u", secret)},
			"sasl.mechanism=PLAIN needs login module " + plainModule},
		{map[string]string{SecurityProtocol: "SASL_SSL", SASLMechanism: MechSCRAMSHA512, SASLJAASConfig: scramModule + ` required username="u" password="` + secret + `"`},
			"ends without ';'"},
		{map[string]string{SecurityProtocol: "SASL_SSL", SASLMechanism: MechSCRAMSHA512, SASLJAASConfig: scramModule + ` required username="u" password="` + secret},
			"the value of option password has no closing quote"},
		{map[string]string{SecurityProtocol: "SASL_SSL", SASLMechanism: MechSCRAMSHA512, SASLJAASConfig: scramModule + ` required username="u" password="` + secret + `" tokenauth=true;`},
			"option tokenauth is not supported"},
		{map[string]string{SecurityProtocol: "SASL_SSL", SASLMechanism: MechSCRAMSHA512, SASLJAASConfig: scramModule + ` required username="u";`},
			`set both username="..." and password="..."`},
		{map[string]string{SecurityProtocol: "SASL_SSL", SASLMechanism: MechPlain, SASLJAASConfig: jaas(plainModule, "u", "${vault:/x:pw}")},
			`config provider "vault"`},
		{map[string]string{SecurityProtocol: "PLAINTEXT", SASLMechanism: MechPlain}, "sasl.mechanism is set but security.protocol=PLAINTEXT does not use SASL"},
		{map[string]string{SecurityProtocol: "SASL_PLAINTEXT", TruststoreLocation: "/ca.pem", SASLMechanism: MechPlain, SASLJAASConfig: jaas(plainModule, "u", secret)},
			"ssl.truststore.location is set but security.protocol=SASL_PLAINTEXT does not use TLS"},
		{map[string]string{ConfigProviders: "vault"}, "config.providers=vault: kmirror supports only the file provider"},
	}
	for _, c := range cases {
		_, err := Parse(c.props, "mirror m1")
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "mirror m1: ") {
			t.Errorf("Parse(%v) = %v, want an error starting with \"mirror m1: \" containing %q", c.props, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("Parse(%v) error shows the secret: %v", c.props, err)
		}
	}
}

func TestParseJAAS(t *testing.T) {
	e, err := parseJAAS("  " + scramModule + "  required\n username=alice password=\"p\\\"w;d\" ; ")
	if err != nil {
		t.Fatal(err)
	}
	if e.module != scramModule || e.flag != "required" || e.options["username"] != "alice" || e.options["password"] != `p"w;d` {
		t.Fatalf("parsed %+v", e)
	}
	for _, bad := range []string{"", scramModule, scramModule + " maybe;", scramModule + " required username;", scramModule + " required a=\"1\"; x required;"} {
		if _, err := parseJAAS(bad); err == nil {
			t.Errorf("parseJAAS(%q) accepted", bad)
		}
	}
}

func TestReferences(t *testing.T) {
	dir := t.TempDir()
	props := filepath.Join(dir, "secrets.properties")
	os.WriteFile(props, []byte("# kmirror secrets\nsource.password="+secret+"\n"), 0o600)
	whole := filepath.Join(dir, "password.txt")
	os.WriteFile(whole, []byte(secret+"\n"), 0o600)
	for _, ref := range []string{"${file:" + props + ":source.password}", "${file:" + whole + "}"} {
		got, err := resolveReferences(SASLJAASConfig, `password="`+ref+`";`)
		if err != nil || got != `password="`+secret+`";` {
			t.Errorf("resolve %s = %q, %v", ref, got, err)
		}
	}
	for ref, want := range map[string]string{
		"${file:" + props + ":missing}":       `has no key "missing"`,
		"${file:" + dir + "/none.properties}": "no such file or directory",
	} {
		_, err := resolveReferences(KeyPassword, ref)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), secret) {
			t.Errorf("resolve %s: %v, want %q and no secret", ref, err, want)
		}
	}
}

func TestRedact(t *testing.T) {
	got := Redact(map[string]string{
		"bootstrap.servers":       "a:9092",
		SASLJAASConfig:            jaas(scramModule, "alice", secret),
		KeyPassword:               secret,
		KeystoreKey:               "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----",
		TruststoreLocation:        "/etc/ca.pem",
		"ssl.truststore.password": "${file:/etc/kmirror/secrets.properties:truststore}",
	})
	for k, v := range got {
		if strings.Contains(v, secret) || strings.Contains(v, "AAAA") {
			t.Errorf("%s shown as %q", k, v)
		}
	}
	if want := scramModule + ` required username="alice" password="[hidden]";`; got[SASLJAASConfig] != want {
		t.Errorf("jaas shown as %q, want %q", got[SASLJAASConfig], want)
	}
	if got["bootstrap.servers"] != "a:9092" || got[TruststoreLocation] != "/etc/ca.pem" || !strings.HasPrefix(got["ssl.truststore.password"], "${file:") {
		t.Errorf("non-secrets or references changed: %v", got)
	}
}

// certs makes a CA, a client certificate and its files.
func certs(t *testing.T, o harness.CertOptions) (*harness.CA, harness.Issued, string) {
	t.Helper()
	ca, err := harness.NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	if o.CommonName == "" {
		o.CommonName = "kmirror"
	}
	iss, err := ca.Issue(o)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "ca.pem"), ca.PEM, 0o600)
	return ca, iss, dir
}

func TestResolveTLS(t *testing.T) {
	_, iss, dir := certs(t, harness.CertOptions{})
	keystore, _ := iss.WriteKeystore(filepath.Join(dir, "kmirror.pem"))
	enc, err := encryptPKCS8(iss.KeyDER, secret)
	if err != nil {
		t.Fatal(err)
	}
	encFile := filepath.Join(dir, "enc.pem")
	os.WriteFile(encFile, append(enc, iss.CertPEM...), 0o600)
	pwFile := filepath.Join(dir, "pw.properties")
	os.WriteFile(pwFile, []byte("key="+secret+"\n"), 0o600)
	_, other, _ := certs(t, harness.CertOptions{})
	expired, _ := harness.NewCA("x")
	expIss, _ := expired.Issue(harness.CertOptions{CommonName: "old", NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	base := map[string]string{SecurityProtocol: "SSL", TruststoreType: "PEM", TruststoreLocation: filepath.Join(dir, "ca.pem"), KeystoreType: "PEM"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	good := []map[string]string{
		with(KeystoreLocation, keystore),
		with(KeystoreKey, string(iss.KeyPEM), KeystoreCertChain, string(iss.CertPEM)),
		with(KeystoreLocation, encFile, KeyPassword, "${file:"+pwFile+":key}"),
		with(TruststoreLocation, "", TruststoreCertificates, filepath.Join(dir, "ca.pem")),
	}
	for _, props := range good {
		s, err := Parse(props, "destination")
		if err != nil {
			t.Fatal(err)
		}
		sec, err := s.Resolve()
		if err != nil {
			t.Fatalf("Resolve(%v): %v", Redact(props), err)
		}
		if sec.TLS == nil || sec.TLS.RootCAs == nil || sec.TLS.MinVersion != tls.VersionTLS12 {
			t.Fatalf("TLS config %+v", sec.TLS)
		}
	}
	bad := []struct {
		props map[string]string
		want  string
	}{
		{with(KeystoreLocation, encFile, KeyPassword, "wrong"), "ssl.key.password is wrong"},
		{with(KeystoreLocation, encFile), "the private key is encrypted: set ssl.key.password"},
		{with(KeystoreLocation, keystore, KeyPassword, secret), "the private key is not encrypted: remove ssl.key.password"},
		{with(KeystoreKey, string(iss.KeyPEM), KeystoreCertChain, string(other.CertPEM)), "the private key does not belong to the first certificate"},
		{with(KeystoreKey, string(expIss.KeyPEM), KeystoreCertChain, string(expIss.CertPEM)), "kmirror's certificate CN=old is valid from"},
		{with(TruststoreLocation, filepath.Join(dir, "none.pem")), "ssl.truststore.location"},
		{with(TruststoreLocation, keystore+"x"), "no such file"},
	}
	for _, c := range bad {
		s, err := Parse(c.props, "destination")
		if err == nil {
			_, err = s.Resolve()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), secret) {
			t.Errorf("Resolve(%v) = %v, want %q (and no secret)", Redact(c.props), err, c.want)
		}
	}
}

func TestResolveSASL(t *testing.T) {
	for _, mech := range []string{MechPlain, MechSCRAMSHA256, MechSCRAMSHA512} {
		s, err := Parse(map[string]string{SecurityProtocol: "SASL_PLAINTEXT", SASLMechanism: mech, SASLJAASConfig: jaas(moduleFor(mech), "alice", secret)}, "mirror m1")
		if err != nil {
			t.Fatal(err)
		}
		sec, err := s.Resolve()
		if err != nil || sec.SASL == nil || sec.SASL.Name() != mech || sec.User != "alice" || sec.TLS != nil {
			t.Fatalf("%s: %+v, %v", mech, sec, err)
		}
	}
}

func TestKeyChangesWithSettingsOnly(t *testing.T) {
	a, _ := Parse(map[string]string{SecurityProtocol: "SSL", "bootstrap.servers": "a:1"}, "m")
	b, _ := Parse(map[string]string{SecurityProtocol: "SSL", "bootstrap.servers": "b:1"}, "m")
	c, _ := Parse(map[string]string{SecurityProtocol: "SSL", TruststoreLocation: "/ca.pem"}, "m")
	if a.Key() != b.Key() || a.Key() == c.Key() {
		t.Fatalf("keys %s %s %s", a.Key(), b.Key(), c.Key())
	}
}
