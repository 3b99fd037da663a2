package kwire

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go/protocol/metadata"
	"github.com/segmentio/kafka-go/sasl/scram"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kmirror/kmirror/integration/harness"
)

// tlsServer accepts TLS connections with cert and completes (or fails)
// the handshake, then closes; it returns the address.
func tlsServer(t *testing.T, cert harness.Issued, clientCAs *x509.CertPool) string {
	t.Helper()
	pair, err := tls.X509KeyPair(cert.CertPEM, cert.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}}
	if clientCAs != nil {
		cfg.ClientCAs, cfg.ClientAuth = clientCAs, tls.RequireAndVerifyClientCert
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	return l.Addr().String()
}

func TestDialExplainsTLSFailures(t *testing.T) {
	ca, err := harness.NewCA("broker-ca")
	if err != nil {
		t.Fatal(err)
	}
	other, _ := harness.NewCA("other-ca")
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	ip := []net.IP{net.ParseIP("127.0.0.1")}
	good, _ := ca.Issue(harness.CertOptions{CommonName: "broker", IPs: ip})
	expired, _ := ca.Issue(harness.CertOptions{CommonName: "broker", IPs: ip, NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	wrongHost, _ := ca.Issue(harness.CertOptions{CommonName: "broker", DNSNames: []string{"kafka.example"}})
	foreign, _ := other.Issue(harness.CertOptions{CommonName: "broker", IPs: ip})
	cases := []struct {
		name    string
		addr    string
		want    string
		clients bool
	}{
		{"unknown CA", tlsServer(t, foreign, nil), "signed by an authority kmirror does not trust: put the CA certificate that signed it (PEM) in ssl.truststore.location", false},
		{"expired", tlsServer(t, expired, nil), "the broker's certificate has expired or is not valid yet", false},
		{"wrong host", tlsServer(t, wrongHost, nil), `not valid for "127.0.0.1"`, false},
		{"client certificate required", tlsServer(t, good, roots), "if its listener requires client certificates (ssl.client.auth=required), set ssl.keystore.location", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := Dial(ctx, c.addr, "test", &Security{TLS: &tls.Config{RootCAs: roots}})
			if err == nil || !errors.Is(err, ErrAuthentication) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.addr) {
				t.Fatalf("Dial: %v\nwant ErrAuthentication naming %s and %q", err, c.addr, c.want)
			}
		})
	}
	t.Run("plaintext client at a TLS listener", func(t *testing.T) {
		addr := tlsServer(t, good, nil)
		_, err := Dial(context.Background(), addr, "test", nil)
		if err == nil || !strings.Contains(err.Error(), "if its listener uses TLS, set security.protocol=SSL or SASL_SSL") {
			t.Fatalf("Dial: %v", err)
		}
	})
}

func TestDialSASL(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "alice", "right"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	addr := c.ListenAddrs()[0]
	ctx := context.Background()
	mech, _ := scram.Mechanism(scram.SHA512, "alice", "right")
	conn, err := Dial(ctx, addr, "test", &Security{SASL: mech, User: "alice"})
	if err != nil {
		t.Fatalf("Dial with the right password: %v", err)
	}
	conn.Close()
	mech, _ = scram.Mechanism(scram.SHA512, "alice", "wrong")
	_, err = Dial(ctx, addr, "test", &Security{SASL: mech, User: "alice"})
	if !errors.Is(err, ErrAuthentication) || !strings.Contains(err.Error(), `user "alice" with SASL mechanism SCRAM-SHA-512`) ||
		!strings.Contains(err.Error(), "check the username and password in sasl.jaas.config") || strings.Contains(err.Error(), "wrong") {
		t.Fatalf("Dial with a wrong password: %v", err)
	}
	mech, _ = scram.Mechanism(scram.SHA256, "alice", "right")
	_, err = Dial(ctx, addr, "test", &Security{SASL: mech, User: "alice"})
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Dial with a mechanism the user has no credentials for: %v", err)
	}
	t.Logf("SCRAM-SHA-256 without credentials: %v", err)
}

// TestDialHintsListenerMismatch: TLS to a plaintext listener (the broker
// drops the connection at the ClientHello), and a client without SASL at
// a SASL listener (the broker drops the first request after ApiVersions).
func TestDialHintsListenerMismatch(t *testing.T) {
	// A listener that reads a little and closes, as a plaintext Kafka
	// listener does with a TLS ClientHello.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Read(make([]byte, 16))
			c.Close()
		}
	}()
	_, err = Dial(context.Background(), l.Addr().String(), "test", &Security{TLS: &tls.Config{InsecureSkipVerify: true}})
	if err == nil || !strings.Contains(err.Error(), "its listener most likely does not use TLS") {
		t.Fatalf("TLS at a listener that closes: %v", err)
	}
	// SASL required: kfake with SASL answers ApiVersions and then drops
	// an unauthenticated request.
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.Superuser("PLAIN", "u", "p"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn, err := Dial(context.Background(), c.ListenAddrs()[0], "test", nil)
	if err != nil {
		t.Logf("dial without SASL failed at once: %v", err)
		return
	}
	defer conn.Close()
	_, err = conn.RoundTrip(context.Background(), &metadata.Request{})
	if err == nil || !strings.Contains(err.Error(), "if its listener uses SASL, set security.protocol=SASL_SSL or SASL_PLAINTEXT") {
		t.Fatalf("first request without SASL: %v", err)
	}
}
