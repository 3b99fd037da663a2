package harness

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

// CA is a certificate authority made for a test (crypto/x509, ECDSA P-256).
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// PEM is the CA certificate, for a truststore.
	PEM []byte
}

// NewCA makes a self-signed CA valid from an hour ago for a day.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// CertOptions describe a certificate the CA issues.
type CertOptions struct {
	// CommonName is the subject's CN; a client certificate's principal is
	// User:CN=<CommonName> under Kafka's default principal builder.
	CommonName string
	DNSNames   []string
	IPs        []net.IP
	// NotBefore and NotAfter default to an hour ago and a day from now.
	NotBefore, NotAfter time.Time
}

// Issued is a key and certificate in PEM.
type Issued struct {
	KeyPEM  []byte // PKCS#8 "PRIVATE KEY"
	CertPEM []byte // the certificate, then the CA's
	KeyDER  []byte // PKCS#8 DER of the key
}

// Issue signs a certificate usable for TLS servers and clients.
func (ca *CA) Issue(o CertOptions) (Issued, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Issued{}, err
	}
	if o.NotBefore.IsZero() {
		o.NotBefore = time.Now().Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = time.Now().Add(24 * time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: o.CommonName},
		DNSNames:     o.DNSNames,
		IPAddresses:  o.IPs,
		NotBefore:    o.NotBefore,
		NotAfter:     o.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return Issued{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Issued{}, err
	}
	certPEM := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), ca.PEM...)
	return Issued{
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		CertPEM: certPEM,
		KeyDER:  keyDER,
	}, nil
}

// WriteKeystore writes the key and chain to one PEM file (the layout of
// ssl.keystore.type=PEM with ssl.keystore.location) and returns its path.
func (i Issued) WriteKeystore(path string) (string, error) {
	if err := os.WriteFile(path, append(append([]byte(nil), i.KeyPEM...), i.CertPEM...), 0o600); err != nil {
		return "", fmt.Errorf("harness: %w", err)
	}
	return path, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}
