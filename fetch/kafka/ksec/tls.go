package ksec

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// tlsVersions reads ssl.enabled.protocols (a list) or ssl.protocol (one)
// into a minimum and maximum TLS version. TLS 1.2 is the lowest kmirror
// speaks (KIP-553 made TLS 1.2 the Java client's lowest too).
func tlsVersions(enabled, protocol string) ([2]uint16, error) {
	versions := map[string]uint16{"TLSv1.2": tls.VersionTLS12, "TLSv1.3": tls.VersionTLS13}
	out := [2]uint16{tls.VersionTLS12, tls.VersionTLS13}
	if enabled = strings.TrimSpace(enabled); enabled != "" {
		out = [2]uint16{tls.VersionTLS13, tls.VersionTLS12}
		for _, p := range strings.Split(enabled, ",") {
			v, ok := versions[strings.TrimSpace(p)]
			if !ok {
				return out, fmt.Errorf("%s: %q is not supported: list TLSv1.2 and/or TLSv1.3", EnabledProtocols, strings.TrimSpace(p))
			}
			out[0], out[1] = min(out[0], v), max(out[1], v)
		}
	}
	switch protocol = strings.TrimSpace(protocol); protocol {
	case "", "TLS", "TLSv1.2", "TLSv1.3":
	default:
		return out, fmt.Errorf("%s=%s is not supported: use TLSv1.3 or TLSv1.2", SSLProtocol, protocol)
	}
	return out, nil
}

// pemValue returns PEM text given inline (holding "-----BEGIN") or as a
// file path.
func pemValue(key, v string) ([]byte, error) {
	if strings.Contains(v, "-----BEGIN") {
		return []byte(v), nil
	}
	data, err := os.ReadFile(strings.TrimSpace(v))
	if err != nil {
		return nil, fmt.Errorf("%s: %v: give PEM text or the path of a PEM file readable by kmirror on every member", key, err)
	}
	return data, nil
}

// tlsConfig builds the client TLS configuration from resolved values.
func tlsConfig(vals map[string]string, now time.Time) (*tls.Config, error) {
	ver, err := tlsVersions(vals[EnabledProtocols], vals[SSLProtocol])
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: ver[0], MaxVersion: ver[1]}
	trustKey, trust := TruststoreLocation, vals[TruststoreLocation]
	if vals[TruststoreCertificates] != "" {
		trustKey, trust = TruststoreCertificates, vals[TruststoreCertificates]
	}
	if trust != "" {
		data, err := pemValue(trustKey, trust)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		certs, err := pemCertificates(trustKey, data)
		if err != nil {
			return nil, err
		}
		for _, c := range certs {
			pool.AddCert(c)
		}
		cfg.RootCAs = pool
	}
	if cert, err := clientCertificate(vals, now); err != nil {
		return nil, err
	} else if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	if strings.TrimSpace(vals[EndpointIdentification]) == "" && hasKey(vals, EndpointIdentification) {
		// ssl.endpoint.identification.algorithm= (empty): check the chain,
		// not the host name, as the Java client does.
		cfg.InsecureSkipVerify = true
		roots := cfg.RootCAs
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the broker sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter})
			return err
		}
	}
	return cfg, nil
}

func hasKey(m map[string]string, k string) bool { _, ok := m[k]; return ok }

// pemCertificates parses every CERTIFICATE block in data.
func pemCertificates(key string, data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: certificate %d is not valid X.509: %v", key, len(out)+1, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no PEM certificate (-----BEGIN CERTIFICATE-----)", key)
	}
	return out, nil
}

// clientCertificate reads kmirror's own key and certificate chain for
// mutual TLS: one PEM file (ssl.keystore.location) or ssl.keystore.key with
// ssl.keystore.certificate.chain. nil when none is configured.
func clientCertificate(vals map[string]string, now time.Time) (*tls.Certificate, error) {
	var keyPEM, chainPEM []byte
	keyName, chainName := KeystoreLocation, KeystoreLocation
	switch {
	case vals[KeystoreLocation] != "":
		data, err := os.ReadFile(vals[KeystoreLocation])
		if err != nil {
			return nil, fmt.Errorf("%s: %v: give the path of a PEM file with kmirror's private key and certificate chain", KeystoreLocation, err)
		}
		keyPEM, chainPEM = data, data
	case vals[KeystoreKey] != "":
		keyName, chainName = KeystoreKey, KeystoreCertChain
		var err error
		if keyPEM, err = pemValue(KeystoreKey, vals[KeystoreKey]); err != nil {
			return nil, err
		}
		if chainPEM, err = pemValue(KeystoreCertChain, vals[KeystoreCertChain]); err != nil {
			return nil, err
		}
	default:
		return nil, nil
	}
	key, err := privateKey(keyName, keyPEM, vals[KeyPassword], hasKey(vals, KeyPassword))
	if err != nil {
		return nil, err
	}
	chain, err := pemCertificates(chainName, chainPEM)
	if err != nil {
		return nil, err
	}
	leaf := chain[0]
	if pub, ok := key.(interface{ Public() crypto.PublicKey }); !ok || !publicKeysEqual(pub.Public(), leaf.PublicKey) {
		return nil, fmt.Errorf("%s: the private key does not belong to the first certificate (%s): put kmirror's own certificate first, then its CAs",
			chainName, leaf.Subject)
	}
	if now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		return nil, fmt.Errorf("%s: kmirror's certificate %s is valid from %s to %s, not now: renew it",
			chainName, leaf.Subject, leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	cert := &tls.Certificate{PrivateKey: key, Leaf: leaf}
	for _, c := range chain {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	return cert, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	e, ok := a.(equaler)
	return ok && e.Equal(b)
}

// privateKey finds the private key in PEM data: PKCS#8 (as the Java
// client's PEM keystore requires), encrypted PKCS#8 with password, or the
// PKCS#1 and SEC 1 forms OpenSSL writes.
func privateKey(name string, data []byte, password string, passwordSet bool) (crypto.Signer, error) {
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, fmt.Errorf("%s holds no PEM private key (-----BEGIN PRIVATE KEY----- or -----BEGIN ENCRYPTED PRIVATE KEY-----)", name)
		}
		var (
			key any
			err error
		)
		switch b.Type {
		case "ENCRYPTED PRIVATE KEY":
			if !passwordSet || password == "" {
				return nil, fmt.Errorf("%s: the private key is encrypted: set %s to its password", name, KeyPassword)
			}
			der, derr := decryptPKCS8(b.Bytes, []byte(password))
			if derr != nil {
				return nil, fmt.Errorf("%s: %v", name, derr)
			}
			if key, err = x509.ParsePKCS8PrivateKey(der); err != nil {
				// The padding matched by chance: still a wrong password.
				return nil, fmt.Errorf("%s: %v", name, errWrongKeyPassword)
			}
		case "PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY":
			if passwordSet {
				return nil, fmt.Errorf("%s: %s is set but the private key is not encrypted: remove %s", name, KeyPassword, KeyPassword)
			}
			switch b.Type {
			case "PRIVATE KEY":
				key, err = x509.ParsePKCS8PrivateKey(b.Bytes)
			case "RSA PRIVATE KEY":
				key, err = x509.ParsePKCS1PrivateKey(b.Bytes)
			default:
				key, err = x509.ParseECPrivateKey(b.Bytes)
			}
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: the private key cannot be read: %v", name, err)
		}
		switch k := key.(type) {
		case *rsa.PrivateKey, *ecdsa.PrivateKey, ed25519.PrivateKey:
			return k.(crypto.Signer), nil
		}
		return nil, fmt.Errorf("%s: unsupported private key type %T: use RSA, ECDSA or Ed25519", name, key)
	}
}
