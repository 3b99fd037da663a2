// Package ksec reads the security settings of a Kafka client the way an
// operator writes them for the Java client (security.protocol, ssl.*,
// sasl.*), with secrets by reference (${file:...}, KIP-297), and turns
// them into a kwire.Security: crypto/tls for TLS, kafka-go's sasl/plain and
// sasl/scram for SASL. It never puts a secret in an error message; Redact
// hides them for display.
package ksec

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// Security property names (the Java client's).
const (
	SecurityProtocol        = "security.protocol"
	TruststoreType          = "ssl.truststore.type"
	TruststoreLocation      = "ssl.truststore.location"
	TruststoreCertificates  = "ssl.truststore.certificates"
	TruststorePassword      = "ssl.truststore.password"
	KeystoreType            = "ssl.keystore.type"
	KeystoreLocation        = "ssl.keystore.location"
	KeystoreKey             = "ssl.keystore.key"
	KeystoreCertChain       = "ssl.keystore.certificate.chain"
	KeystorePassword        = "ssl.keystore.password"
	KeyPassword             = "ssl.key.password"
	EndpointIdentification  = "ssl.endpoint.identification.algorithm"
	EnabledProtocols        = "ssl.enabled.protocols"
	SSLProtocol             = "ssl.protocol"
	SASLMechanism           = "sasl.mechanism"
	SASLJAASConfig          = "sasl.jaas.config"
	ConfigProviders         = "config.providers"
	ConfigProviderFileClass = "config.providers.file.class"
)

// keys are the properties Parse reads.
var keys = []string{
	SecurityProtocol, TruststoreType, TruststoreLocation, TruststoreCertificates, TruststorePassword,
	KeystoreType, KeystoreLocation, KeystoreKey, KeystoreCertChain, KeystorePassword, KeyPassword,
	EndpointIdentification, EnabledProtocols, SSLProtocol, SASLMechanism, SASLJAASConfig,
	ConfigProviders, ConfigProviderFileClass,
}

// IsKey reports whether k is a security property ksec reads (some only
// to refuse them with a reason, such as store passwords with PEM).
func IsKey(k string) bool { return slices.Contains(keys, k) }

// Keys lists the security properties kmirror acts on, sorted (not the
// ones it reads only to refuse).
func Keys() []string {
	var out []string
	for _, k := range keys {
		if k != TruststorePassword && k != KeystorePassword {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// secretKeys hold secrets: their values are never shown or put in errors.
var secretKeys = map[string]bool{
	TruststorePassword: true, KeystorePassword: true, KeyPassword: true, KeystoreKey: true, SASLJAASConfig: true,
}

// Security protocols (security.protocol).
const (
	Plaintext     = "PLAINTEXT"
	SSL           = "SSL"
	SASLPlaintext = "SASL_PLAINTEXT"
	SASLSSL       = "SASL_SSL"
)

// SASL mechanisms kmirror speaks.
const (
	MechPlain       = "PLAIN"
	MechSCRAMSHA256 = "SCRAM-SHA-256"
	MechSCRAMSHA512 = "SCRAM-SHA-512"
)

// Settings are a client's checked security properties. References stay
// unresolved until Resolve, which runs at every dial.
type Settings struct {
	// Protocol is security.protocol (PLAINTEXT by default).
	Protocol string
	props    map[string]string // the security properties given
	// where names the settings in messages, such as "mirror m1" or
	// "destination".
	where string
}

// Parse checks the security properties among props (other keys are left
// to the caller) without reading any file. where names the settings in
// errors ("mirror m1", "destination"). Errors name the property and what to
// write, and never quote a secret.
func Parse(props map[string]string, where string) (Settings, error) {
	s := Settings{Protocol: Plaintext, props: map[string]string{}, where: where}
	for k, v := range props {
		if IsKey(k) {
			s.props[k] = strings.TrimSpace(v)
		}
	}
	fail := func(format string, args ...any) (Settings, error) {
		return Settings{}, fmt.Errorf("%s: "+format, append([]any{where}, args...)...)
	}
	for _, k := range slices.Sorted(maps.Keys(s.props)) {
		if err := checkReferences(k, s.props[k]); err != nil {
			return fail("%v", err)
		}
		if strings.Contains(s.props[k], hidden) {
			return fail("%s holds %s, which kmirror list shows in place of a secret: give the secret itself, or better a ${file:/path:key} reference",
				k, hidden)
		}
	}
	if v, ok := s.props[SecurityProtocol]; ok && v != "" {
		s.Protocol = strings.ToUpper(v)
	}
	tlsOn, saslOn := false, false
	switch s.Protocol {
	case Plaintext:
	case SSL:
		tlsOn = true
	case SASLPlaintext:
		saslOn = true
	case SASLSSL:
		tlsOn, saslOn = true, true
	default:
		return fail("%s=%s: use PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL", SecurityProtocol, s.props[SecurityProtocol])
	}
	if err := s.checkProviders(); err != nil {
		return fail("%v", err)
	}
	var sslKeys, saslKeys []string
	for k := range s.props {
		switch {
		case strings.HasPrefix(k, "ssl."):
			sslKeys = append(sslKeys, k)
		case strings.HasPrefix(k, "sasl."):
			saslKeys = append(saslKeys, k)
		}
	}
	sort.Strings(sslKeys)
	sort.Strings(saslKeys)
	if !tlsOn && len(sslKeys) > 0 {
		return fail("%s set but security.protocol=%s does not use TLS: set security.protocol=SSL or SASL_SSL, or remove %s",
			isAre(sslKeys), s.Protocol, itThem(sslKeys))
	}
	if !saslOn && len(saslKeys) > 0 {
		return fail("%s set but security.protocol=%s does not use SASL: set security.protocol=SASL_SSL or SASL_PLAINTEXT, or remove %s",
			isAre(saslKeys), s.Protocol, itThem(saslKeys))
	}
	if tlsOn {
		if err := s.checkTLS(); err != nil {
			return fail("%v", err)
		}
	}
	if saslOn {
		if err := s.checkSASL(); err != nil {
			return fail("%v", err)
		}
	}
	return s, nil
}

func (s Settings) checkProviders() error {
	if v, ok := s.props[ConfigProviders]; ok && strings.TrimSpace(v) != "file" {
		return fmt.Errorf("%s=%s: kmirror supports only the file provider: set %s=file or leave it out", ConfigProviders, v, ConfigProviders)
	}
	if v, ok := s.props[ConfigProviderFileClass]; ok && v != "org.apache.kafka.common.config.provider.FileConfigProvider" {
		return fmt.Errorf("%s=%s: kmirror's file provider is FileConfigProvider's: set org.apache.kafka.common.config.provider.FileConfigProvider or leave it out",
			ConfigProviderFileClass, v)
	}
	return nil
}

func (s Settings) checkTLS() error {
	for _, k := range []string{TruststoreType, KeystoreType} {
		if v, ok := s.props[k]; ok && v != "" && !strings.EqualFold(v, "PEM") {
			return fmt.Errorf("%s=%s: kmirror reads PEM stores only: set %s=PEM and convert the store "+
				"(openssl pkcs12 -in store.p12 -out store.pem, or keytool -importkeystore -deststoretype PKCS12 first for JKS)", k, v, k)
		}
	}
	if _, ok := s.props[TruststorePassword]; ok {
		return fmt.Errorf("%s is set: a PEM truststore has no password (as in the Java client): remove it", TruststorePassword)
	}
	if _, ok := s.props[KeystorePassword]; ok {
		return fmt.Errorf("%s is set: a PEM keystore has no store password (as in the Java client): remove it, and put the password of an encrypted private key in %s",
			KeystorePassword, KeyPassword)
	}
	if s.has(TruststoreLocation) && s.has(TruststoreCertificates) {
		return fmt.Errorf("both %s and %s are set: keep one", TruststoreLocation, TruststoreCertificates)
	}
	inline := s.has(KeystoreKey) || s.has(KeystoreCertChain)
	if inline && s.has(KeystoreLocation) {
		return fmt.Errorf("%s is set together with %s/%s: give the key and certificate chain either in one file (%s) or as %s and %s",
			KeystoreLocation, KeystoreKey, KeystoreCertChain, KeystoreLocation, KeystoreKey, KeystoreCertChain)
	}
	if inline && !(s.has(KeystoreKey) && s.has(KeystoreCertChain)) {
		return fmt.Errorf("%s and %s go together: set both (PEM text or a file path each)", KeystoreKey, KeystoreCertChain)
	}
	if s.has(KeyPassword) && !inline && !s.has(KeystoreLocation) {
		return fmt.Errorf("%s is set but no client key is: set %s (or %s and %s), or remove %s",
			KeyPassword, KeystoreLocation, KeystoreKey, KeystoreCertChain, KeyPassword)
	}
	switch v := s.props[EndpointIdentification]; strings.ToLower(v) {
	case "https", "":
	default:
		return fmt.Errorf("%s=%s: use https (check the broker's host name, the default) or an empty value (do not)", EndpointIdentification, v)
	}
	if _, err := tlsVersions(s.props[EnabledProtocols], s.props[SSLProtocol]); err != nil {
		return err
	}
	return nil
}

func (s Settings) checkSASL() error {
	mech := s.props[SASLMechanism]
	switch mech {
	case MechPlain, MechSCRAMSHA256, MechSCRAMSHA512:
	case "":
		return fmt.Errorf("%s is not set: set PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (the Java client's default, GSSAPI, is not supported)", SASLMechanism)
	default:
		return fmt.Errorf("%s=%s is not supported: use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", SASLMechanism, mech)
	}
	jaas, ok := s.props[SASLJAASConfig]
	if !ok || jaas == "" {
		return fmt.Errorf("%s is not set: set it to %s required username=\"...\" password=\"...\";", SASLJAASConfig, moduleFor(mech))
	}
	if isOnlyReferences(jaas) {
		return nil // checked when resolved
	}
	_, err := jaasCredentials(jaas, mech)
	return err
}

func (s Settings) has(k string) bool { return s.props[k] != "" }

// Key identifies the settings as given (references unresolved): it changes
// when a property changes, not when a file it names does. It is a hash,
// safe to log.
func (s Settings) Key() string {
	h := sha256.New()
	for _, k := range Keys() {
		if v, ok := s.props[k]; ok {
			fmt.Fprintf(h, "%s=%s\n", k, v)
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// credentials are the SASL user and password from sasl.jaas.config.
type credentials struct{ user, password string }

// jaasCredentials reads username and password from a sasl.jaas.config whose
// login module must suit the mechanism.
func jaasCredentials(jaas, mech string) (credentials, error) {
	e, err := parseJAAS(jaas)
	if err != nil {
		return credentials{}, err
	}
	if want := moduleFor(mech); e.module != want {
		return credentials{}, fmt.Errorf("%s: sasl.mechanism=%s needs login module %s (found %s)", SASLJAASConfig, mech, want, e.module)
	}
	if !strings.EqualFold(e.flag, "required") {
		return credentials{}, fmt.Errorf("%s: the control flag must be required (found %s)", SASLJAASConfig, e.flag)
	}
	for _, k := range e.order {
		if k != "username" && k != "password" {
			return credentials{}, fmt.Errorf("%s: option %s is not supported: kmirror's %s login takes username and password only", SASLJAASConfig, k, mech)
		}
	}
	c := credentials{user: e.options["username"], password: e.options["password"]}
	if c.user == "" || c.password == "" {
		return credentials{}, fmt.Errorf("%s: set both username=\"...\" and password=\"...\"", SASLJAASConfig)
	}
	return c, nil
}

func moduleFor(mech string) string {
	if mech == MechPlain {
		return plainModule
	}
	return scramModule
}

// Resolve reads the files and references the settings name and returns
// how to secure a connection; nil for PLAINTEXT. Errors name the property
// and file, never a secret.
func (s Settings) Resolve() (*kwire.Security, error) {
	if s.Protocol == Plaintext || s.Protocol == "" {
		return nil, nil
	}
	vals := make(map[string]string, len(s.props))
	for k, v := range s.props {
		r, err := resolveReferences(k, v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.where, err)
		}
		vals[k] = r
	}
	sec := &kwire.Security{TruststoreHint: s.where + "'s " + TruststoreLocation}
	if s.Protocol == SSL || s.Protocol == SASLSSL {
		cfg, err := tlsConfig(vals, time.Now())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.where, err)
		}
		sec.TLS = cfg
		if vals[TruststoreCertificates] != "" {
			sec.TruststoreHint = s.where + "'s " + TruststoreCertificates
		}
	}
	if s.Protocol == SASLSSL || s.Protocol == SASLPlaintext {
		mech, user, err := saslMechanism(vals[SASLMechanism], vals[SASLJAASConfig])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.where, err)
		}
		sec.SASL, sec.User = mech, user
	}
	return sec, nil
}

func saslMechanism(mech, jaas string) (sasl.Mechanism, string, error) {
	c, err := jaasCredentials(jaas, mech)
	if err != nil {
		return nil, "", err
	}
	switch mech {
	case MechPlain:
		return plain.Mechanism{Username: c.user, Password: c.password}, c.user, nil
	case MechSCRAMSHA256, MechSCRAMSHA512:
		algo := scram.SHA256
		if mech == MechSCRAMSHA512 {
			algo = scram.SHA512
		}
		m, err := scram.Mechanism(algo, c.user, c.password)
		if err != nil {
			// SASLprep refused the user name or password; say which,
			// not what.
			return nil, "", fmt.Errorf("%s: the username or password is not valid for %s (SASLprep, RFC 4013): avoid control characters", SASLJAASConfig, mech)
		}
		return m, c.user, nil
	}
	return nil, "", fmt.Errorf("%s=%s is not supported: use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", SASLMechanism, mech)
}

// hidden replaces a secret in displayed properties.
const hidden = "[hidden]"

// isOnlyReferences reports whether v consists of ${...} references alone,
// which name where a secret is kept, not the secret.
func isOnlyReferences(v string) bool {
	v = strings.TrimSpace(v)
	return v != "" && strings.TrimSpace(reference.ReplaceAllString(v, "")) == ""
}

// IsSecret reports whether property k holds a secret: a password, a
// private key or a JAAS configuration, or any key naming a password,
// secret or token.
func IsSecret(k string) bool {
	l := strings.ToLower(k)
	return secretKeys[k] || strings.Contains(l, "password") || strings.Contains(l, "secret") || strings.Contains(l, "token") ||
		strings.Contains(l, "jaas")
}

// Redact returns props for display: secrets are replaced by [hidden],
// except values that only reference where a secret is kept (${file:...})
// and file paths given for a private key; sasl.jaas.config keeps its login
// module and username.
func Redact(props map[string]string) map[string]string {
	if props == nil {
		return nil
	}
	out := make(map[string]string, len(props))
	for k, v := range props {
		switch {
		case !IsSecret(k) || isOnlyReferences(v):
			out[k] = v
		case k == SASLJAASConfig:
			out[k] = redactJAAS(v)
		case k == KeystoreKey && strings.HasPrefix(v, "/") && !strings.ContainsAny(v, " \n"):
			out[k] = v // a file path
		default:
			out[k] = hidden
		}
	}
	return out
}

func isAre(keys []string) string {
	if len(keys) == 1 {
		return keys[0] + " is"
	}
	return strings.Join(keys, ", ") + " are"
}

func itThem(keys []string) string {
	if len(keys) == 1 {
		return "it"
	}
	return "them"
}

// Principal is the Kafka principal the broker's default principal builder
// gives a client with these settings: User:<SASL user name>, else
// User:<client certificate subject in RFC 2253 form> for mTLS, else
// User:ANONYMOUS. A broker with ssl.principal.mapping.rules or a custom
// principal builder names clients differently.
func (s Settings) Principal() (string, error) {
	sec, err := s.Resolve()
	switch {
	case err != nil:
		return "", err
	case sec == nil:
		return "User:ANONYMOUS", nil
	case sec.SASL != nil:
		return "User:" + sec.User, nil
	case sec.TLS != nil && len(sec.TLS.Certificates) > 0 && sec.TLS.Certificates[0].Leaf != nil:
		return "User:" + sec.TLS.Certificates[0].Leaf.Subject.String(), nil
	}
	return "User:ANONYMOUS", nil
}
