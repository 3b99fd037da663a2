package ksec

import (
	"strings"
	"testing"
)

// FuzzParseProperties: any file gives properties or an error naming a
// line, never a panic; every accepted key is non-empty and trimmed.
func FuzzParseProperties(f *testing.F) {
	f.Add("bootstrap.servers=a:9092\n# comment\nsasl.jaas.config=" + scramModule + " required \\\n  username=\"u\" password=\"p\";\n")
	f.Add("a: b\n!bang\nk=v\\\\\nx=${file:/etc/s.properties:key}\n")
	f.Add("=novalue\n")
	f.Fuzz(func(t *testing.T, text string) {
		props, err := ParseProperties(strings.NewReader(text))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "line ") {
				t.Fatalf("error does not name a line: %v", err)
			}
			return
		}
		for k := range props {
			if k == "" || strings.TrimSpace(k) != k {
				t.Fatalf("key %q accepted", k)
			}
		}
	})
}

// FuzzSecuritySettings: any security properties are accepted or refused
// without a panic, and neither the error nor Redact's display shows the
// password of a sasl.jaas.config.
func FuzzSecuritySettings(f *testing.F) {
	f.Add("SASL_SSL", "SCRAM-SHA-512", scramModule+` required username="alice" password="PW-SECRET";`, "https")
	f.Add("SASL_PLAINTEXT", "PLAIN", plainModule+` required username=alice password=PW-SECRET;`, "")
	f.Add("SSL", "", "", "http")
	f.Add("SASL_SSL", "PLAIN", plainModule+` required username="a" password="PW-SECRET" extra="x";`, "https")
	f.Add("SASL_SSL", "SCRAM-SHA-256", scramModule+` required username="u" password="${file:/nope:k}";`, "https")
	f.Fuzz(func(t *testing.T, protocol, mech, jaas, endpoint string) {
		props := map[string]string{SecurityProtocol: protocol, SASLMechanism: mech, SASLJAASConfig: jaas, EndpointIdentification: endpoint}
		e, jerr := parseJAAS(jaas)
		secret := ""
		if jerr == nil && len(e.options["password"]) >= 6 && !strings.Contains(jaas, "${") {
			secret = e.options["password"]
		}
		_, err := Parse(props, "mirror m1")
		if secret == "" {
			return
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Fatalf("error shows the password: %v", err)
		}
		for k, v := range Redact(props) {
			if k == SASLJAASConfig && strings.Contains(v, secret) && !strings.Contains(e.options["username"], secret) && !strings.Contains(e.module+e.flag, secret) {
				t.Fatalf("Redact shows the password: %q", v)
			}
		}
	})
}
