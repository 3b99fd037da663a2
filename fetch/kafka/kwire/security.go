package kwire

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	kafka "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/saslauthenticate"
	"github.com/segmentio/kafka-go/protocol/saslhandshake"
	"github.com/segmentio/kafka-go/sasl"
)

// Security is how a connection is secured, as Kafka's security.protocol
// names it: TLS set means SSL, SASL set means SASL_PLAINTEXT, both
// SASL_SSL; a nil *Security is PLAINTEXT.
type Security struct {
	// TLS is the client's TLS configuration. Dial clones it per broker and
	// sets ServerName to the broker's host unless it is set already.
	TLS *tls.Config
	// SASL authenticates after ApiVersions (KIP-43, KIP-152: SaslHandshake
	// v1 then SaslAuthenticate).
	SASL sasl.Mechanism
	// User is the SASL user name, for error messages (never a secret).
	User string
	// TruststoreHint names the setting that holds the trusted CAs, for
	// TLS error messages; default "ssl.truststore.location".
	TruststoreHint string
}

// Kafka error codes of the SASL exchange.
const (
	codeUnsupportedSASLMechanism int16 = 33
	codeIllegalSASLState         int16 = 34
	codeSASLAuthenticationFailed int16 = 58
)

// ErrAuthentication marks a failure to authenticate: TLS certificate checks,
// SASL credentials, or security settings that cannot be read. Retrying
// does not help until the operator fixes the named setting.
var ErrAuthentication = errors.New("authentication failed")

// secure runs the TLS handshake over nc when sec asks for TLS.
func secure(ctx context.Context, nc net.Conn, addr string, sec *Security) (net.Conn, error) {
	if sec == nil || sec.TLS == nil {
		return nc, nil
	}
	cfg := sec.TLS.Clone()
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		cfg.ServerName = host
	}
	tc := tls.Client(nc, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, explainTLS(addr, sec, err)
	}
	return tc, nil
}

// explainTLS turns a TLS failure into a message naming the broker and what
// to fix.
func explainTLS(addr string, sec *Security, err error) error {
	var (
		unknown  x509.UnknownAuthorityError
		invalid  x509.CertificateInvalidError
		hostname x509.HostnameError
		rec      tls.RecordHeaderError
	)
	trust := sec.TruststoreHint
	if trust == "" {
		trust = "ssl.truststore.location"
	}
	var fix string
	switch {
	case errors.As(err, &unknown):
		fix = fmt.Sprintf("the broker's certificate is signed by an authority kmirror does not trust: put the CA certificate that signed it (PEM) in %s", trust)
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		fix = fmt.Sprintf("the broker's certificate has expired or is not valid yet (%v): renew the broker's certificate, or check this host's clock", invalid.Detail)
	case errors.As(err, &invalid):
		fix = fmt.Sprintf("the broker's certificate is not acceptable (%v): issue it for TLS server use from the CA in %s", err, trust)
	case errors.As(err, &hostname):
		fix = fmt.Sprintf("the broker's certificate is not valid for %q (%v): connect by a name the certificate holds, reissue it with this name, "+
			"or set ssl.endpoint.identification.algorithm= (empty) to skip the host-name check", hostname.Host, err)
	case isTLSAlert(err):
		fix = fmt.Sprintf("the broker refused the TLS handshake (%v): if its listener requires client certificates (ssl.client.auth=required), "+
			"set ssl.keystore.location (or ssl.keystore.key and ssl.keystore.certificate.chain) to a certificate its truststore accepts", err)
	case errors.As(err, &rec):
		fix = "the broker did not answer in TLS: its listener is PLAINTEXT or SASL_PLAINTEXT; use that security.protocol or the broker's SSL listener"
	case closedByPeer(err):
		fix = fmt.Sprintf("the broker closed the connection during the TLS handshake (%v): its listener most likely does not use TLS (PLAINTEXT or SASL_PLAINTEXT); "+
			"use that security.protocol, or the broker's SSL or SASL_SSL listener", err)
	default:
		return fmt.Errorf("TLS handshake with kafka broker %s: %w", addr, err)
	}
	return fmt.Errorf("%w: TLS handshake with kafka broker %s: %s", ErrAuthentication, addr, fix)
}

// explainFirstExchange explains a connection that fails at its first
// exchange (ApiVersions). With TLS 1.3 the broker checks the client's
// certificate after the client considers the handshake done, so a refused
// certificate shows here; without TLS, a broker whose listener expects TLS
// drops the connection on the first bytes.
func explainFirstExchange(addr string, sec *Security, err error) error {
	switch {
	case sec != nil && sec.TLS != nil && isTLSAlert(err):
		return explainTLS(addr, sec, err)
	case (sec == nil || sec.TLS == nil) && closedByPeer(err):
		return fmt.Errorf("%w (the broker closed the connection: if its listener uses TLS, set security.protocol=SSL or SASL_SSL)", err)
	}
	return err
}

// isTLSAlert reports whether err is an alert the peer sent (crypto/tls
// reports it as a net.OpError "remote error").
func isTLSAlert(err error) bool {
	var op *net.OpError
	var alert tls.AlertError
	return (errors.As(err, &op) && op.Op == "remote error") || errors.As(err, &alert)
}

func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// authenticate runs the SASL exchange on a connection whose ApiVersions are
// known.
func (c *Conn) authenticate(ctx context.Context, sec *Security) error {
	if sec == nil || sec.SASL == nil {
		return nil
	}
	mech := sec.SASL.Name()
	who := fmt.Sprintf("user %q with SASL mechanism %s", sec.User, mech)
	res, err := c.RoundTrip(ctx, &saslhandshake.Request{Mechanism: mech})
	if err != nil {
		return fmt.Errorf("SASL handshake with kafka broker %s: %w%s", c.addr, err, plaintextHint(err))
	}
	hs := res.(*saslhandshake.Response)
	switch hs.ErrorCode {
	case 0:
	case codeUnsupportedSASLMechanism:
		return fmt.Errorf("%w: kafka broker %s does not enable SASL mechanism %s on this listener (it enables %s): set sasl.mechanism to one of those",
			ErrAuthentication, c.addr, mech, strings.Join(hs.Mechanisms, ", "))
	case codeIllegalSASLState:
		return fmt.Errorf("%w: kafka broker %s refused the SASL handshake (%v): its listener most likely does not use SASL (PLAINTEXT or SSL): "+
			"use that security.protocol, or the broker's SASL_SSL or SASL_PLAINTEXT listener", ErrAuthentication, c.addr, protocolError(hs.ErrorCode))
	default:
		return fmt.Errorf("SASL handshake with kafka broker %s: %w", c.addr, protocolError(hs.ErrorCode))
	}
	sctx := sasl.WithMetadata(ctx, &sasl.Metadata{Host: c.host(), Port: c.port()})
	sess, state, err := sec.SASL.Start(sctx)
	if err != nil {
		return fmt.Errorf("SASL %s start for kafka broker %s: %w", mech, c.addr, err)
	}
	for done := false; !done; {
		res, err := c.RoundTrip(ctx, &saslauthenticate.Request{AuthBytes: state})
		if err != nil && closedByPeer(err) {
			// Some brokers close the connection instead of answering
			// SASL_AUTHENTICATION_FAILED (as kafka-go also assumes).
			return fmt.Errorf("%w: kafka broker %s closed the connection during SASL authentication of %s: it most likely refused the credentials: "+
				"check the username and password in sasl.jaas.config, and that the user exists on that cluster with credentials for %s",
				ErrAuthentication, c.addr, who, mech)
		}
		if err != nil {
			return fmt.Errorf("SASL authentication of %s at kafka broker %s: %w", who, c.addr, err)
		}
		ar := res.(*saslauthenticate.Response)
		switch ar.ErrorCode {
		case 0:
		case codeSASLAuthenticationFailed:
			return fmt.Errorf("%w: kafka broker %s refused %s (%s): check the username and password in sasl.jaas.config, "+
				"and that the user exists on that cluster with credentials for %s", ErrAuthentication, c.addr, who, ar.ErrorMessage, mech)
		default:
			return fmt.Errorf("SASL authentication of %s at kafka broker %s: %w: %s", who, c.addr, protocolError(ar.ErrorCode), ar.ErrorMessage)
		}
		done, state, err = sess.Next(sctx, ar.AuthBytes)
		if err != nil {
			return fmt.Errorf("%w: SASL %s exchange with kafka broker %s: %v", ErrAuthentication, mech, c.addr, err)
		}
	}
	return nil
}

// firstRequestHint explains a connection the broker closed at the first
// request after ApiVersions: a SASL listener refuses any other request
// before authentication and closes the connection.
func (c *Conn) firstRequestHint(err error) error {
	if c.requests > 1 {
		return err
	}
	return c.hintFirst(err)
}

// hintFirst is firstRequestHint for an error of the first request.
func (c *Conn) hintFirst(err error) error {
	if err == nil || c.sasl || !closedByPeer(err) {
		return err
	}
	return fmt.Errorf("%w (the broker closed the connection at kmirror's first request: if its listener uses SASL, "+
		"set security.protocol=SASL_SSL or SASL_PLAINTEXT with sasl.mechanism and sasl.jaas.config)", err)
}

// protocolError names a Kafka error code.
func protocolError(code int16) error {
	return fmt.Errorf("kafka error %d %s: %s", code, kafka.Error(code).Title(), kafka.Error(code).Description())
}

// plaintextHint explains a connection the broker dropped during the SASL
// handshake.
func plaintextHint(err error) string {
	if closedByPeer(err) {
		return " (the broker closed the connection: is this listener's security.protocol the one configured?)"
	}
	return ""
}

func (c *Conn) host() string {
	h, _, err := net.SplitHostPort(c.addr)
	if err != nil {
		return c.addr
	}
	return h
}

func (c *Conn) port() int {
	_, p, _ := net.SplitHostPort(c.addr)
	n := 0
	fmt.Sscan(p, &n)
	return n
}
