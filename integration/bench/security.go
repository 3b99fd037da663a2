package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kmirror/kmirror/integration/harness"
)

// Security modes of --security.
const (
	securityPlaintext = "plaintext"
	securitySASLSSL   = "sasl_ssl"
)

var securityModes = []string{securityPlaintext, securitySASLSSL}

// benchUser is the SCRAM-SHA-512 user every client of a sasl_ssl run
// authenticates as.
const benchUser, benchPassword = "bench", "bench-secret"

// tlsSetup holds what a sasl_ssl run writes into the bench folder.
type tlsSetup struct {
	caFile, keystore, secretsFile string
}

// prepareSecurity writes a CA, the brokers' keystore and the password
// file for --security sasl_ssl; it is a no-op for plaintext.
func (b *bench) prepareSecurity() error {
	if b.cfg.Security != securitySASLSSL {
		return nil
	}
	ca, err := harness.NewCA("bench-ca")
	if err != nil {
		return err
	}
	iss, err := ca.Issue(harness.CertOptions{CommonName: "bench-broker", IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		return err
	}
	b.tls.caFile = filepath.Join(b.dir, "ca.pem")
	if err := os.WriteFile(b.tls.caFile, ca.PEM, 0o600); err != nil {
		return err
	}
	if b.tls.keystore, err = iss.WriteKeystore(filepath.Join(b.dir, "broker.pem")); err != nil {
		return err
	}
	b.tls.secretsFile = filepath.Join(b.dir, "secrets.properties")
	return os.WriteFile(b.tls.secretsFile, []byte("password="+benchPassword+"\n"), 0o600)
}

// clusterOptions adds the SASL_SSL listener (SCRAM-SHA-512) for sasl_ssl.
func (b *bench) clusterOptions(o harness.Options) harness.Options {
	if b.cfg.Security != securitySASLSSL {
		return o
	}
	o.Listeners = []string{"SASL_SSL"}
	o.BrokerProps = map[string]string{
		"sasl.enabled.mechanisms":                               "SCRAM-SHA-512",
		"listener.name.sasl_ssl.ssl.keystore.type":              "PEM",
		"listener.name.sasl_ssl.ssl.keystore.location":          b.tls.keystore,
		"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required;",
	}
	o.FormatArgs = []string{"--add-scram", fmt.Sprintf("SCRAM-SHA-512=[name=%s,password=%s]", benchUser, benchPassword)}
	return o
}

// clientAddr is the listener kmirror and the baseline producer use.
func (b *bench) clientAddr(cl *harness.Cluster) string {
	if b.cfg.Security == securitySASLSSL {
		return strings.Join(cl.ListenerAddrs("SASL_SSL"), ",")
	}
	return cl.Bootstrap()
}

// clientProps are the Java client's security properties for sasl_ssl
// (none for plaintext): kmirror's mirror properties and destination
// section, and the baseline producer's config take the same keys.
func (b *bench) clientProps() map[string]string {
	if b.cfg.Security != securitySASLSSL {
		return nil
	}
	return map[string]string{
		"security.protocol":       "SASL_SSL",
		"ssl.truststore.type":     "PEM",
		"ssl.truststore.location": b.tls.caFile,
		"sasl.mechanism":          "SCRAM-SHA-512",
		"sasl.jaas.config": fmt.Sprintf(`org.apache.kafka.common.security.scram.ScramLoginModule required username="%s" password="${file:%s:password}";`,
			benchUser, b.tls.secretsFile),
	}
}

// producerConfig writes the baseline producer's security properties to a
// file for ProducerPerformance --producer.config ("" for plaintext). The
// Java client resolves ${file:...} only with the file config provider.
func (b *bench) producerConfig() (string, error) {
	props := b.clientProps()
	if props == nil {
		return "", nil
	}
	props["sasl.jaas.config"] = fmt.Sprintf(`org.apache.kafka.common.security.scram.ScramLoginModule required username="%s" password="%s";`, benchUser, benchPassword)
	path := filepath.Join(b.dir, "producer-security.properties")
	return path, os.WriteFile(path, []byte(propertiesText(props)), 0o600)
}

// destinationYAML is the destination section's security keys.
func (b *bench) destinationYAML() string {
	props := b.clientProps()
	var out strings.Builder
	for _, k := range sortedProps(props) {
		fmt.Fprintf(&out, "  %s: '%s'\n", k, strings.ReplaceAll(props[k], "'", "''"))
	}
	return out.String()
}

func propertiesText(props map[string]string) string {
	var out strings.Builder
	for _, k := range sortedProps(props) {
		fmt.Fprintf(&out, "%s=%s\n", k, props[k])
	}
	return out.String()
}

func sortedProps(props map[string]string) []string {
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// mirrorProps are the bench mirror's properties.
func (b *bench) mirrorProps() map[string]string {
	props := b.clientProps()
	if props == nil {
		props = map[string]string{}
	}
	props["bootstrap.servers"] = b.clientAddr(b.src)
	return props
}
