package ksec

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/pbkdf2"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"hash"
)

// Object identifiers of PKCS#5 v2.0 (RFC 8018) and the AES modes.
var (
	oidPBES2          = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 5, 13}
	oidPBKDF2         = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 5, 12}
	oidHMACWithSHA1   = asn1.ObjectIdentifier{1, 2, 840, 113549, 2, 7}
	oidHMACWithSHA256 = asn1.ObjectIdentifier{1, 2, 840, 113549, 2, 9}
	oidHMACWithSHA384 = asn1.ObjectIdentifier{1, 2, 840, 113549, 2, 10}
	oidHMACWithSHA512 = asn1.ObjectIdentifier{1, 2, 840, 113549, 2, 11}
	oidAES128CBC      = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 1, 2}
	oidAES192CBC      = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 1, 22}
	oidAES256CBC      = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 1, 42}
)

// encryptedPrivateKeyInfo is PKCS#8's encrypted form (RFC 5208 section 6).
type encryptedPrivateKeyInfo struct {
	Algorithm pkix.AlgorithmIdentifier
	Data      []byte
}

// pbes2Params are RFC 8018 appendix A.4's parameters.
type pbes2Params struct {
	KDF    pkix.AlgorithmIdentifier
	Scheme pkix.AlgorithmIdentifier
}

// pbkdf2Params are RFC 8018 appendix A.2's parameters.
type pbkdf2Params struct {
	Salt       []byte
	Iterations int
	KeyLength  int                      `asn1:"optional"`
	PRF        pkix.AlgorithmIdentifier `asn1:"optional"`
}

// aesKeySize returns the key size in bytes of an AES-CBC scheme OID.
func aesKeySize(oid asn1.ObjectIdentifier) int {
	switch {
	case oid.Equal(oidAES128CBC):
		return 16
	case oid.Equal(oidAES192CBC):
		return 24
	case oid.Equal(oidAES256CBC):
		return 32
	}
	return 0
}

func prfHash(oid asn1.ObjectIdentifier) func() hash.Hash {
	switch {
	case len(oid) == 0 || oid.Equal(oidHMACWithSHA1):
		return sha1.New
	case oid.Equal(oidHMACWithSHA256):
		return sha256.New
	case oid.Equal(oidHMACWithSHA384):
		return sha512.New384
	case oid.Equal(oidHMACWithSHA512):
		return sha512.New
	}
	return nil
}

// errWrongKeyPassword is what a wrong ssl.key.password produces: the
// padding check after decryption fails.
var errWrongKeyPassword = errors.New("the private key cannot be decrypted: ssl.key.password is wrong")

// decryptPKCS8 decrypts an ENCRYPTED PRIVATE KEY block's DER (PBES2 with
// PBKDF2 and AES-CBC, what OpenSSL 1.1+ and Java write) and returns the
// PKCS#8 DER of the key.
func decryptPKCS8(der, password []byte) ([]byte, error) {
	var info encryptedPrivateKeyInfo
	if _, err := asn1.Unmarshal(der, &info); err != nil {
		return nil, fmt.Errorf("the encrypted private key is not PKCS#8: %v", err)
	}
	if !info.Algorithm.Algorithm.Equal(oidPBES2) {
		return nil, fmt.Errorf("the private key is encrypted with %v, not PBES2: re-encrypt it with openssl pkcs8 -topk8 -v2 aes-256-cbc", info.Algorithm.Algorithm)
	}
	var params pbes2Params
	if _, err := asn1.Unmarshal(info.Algorithm.Parameters.FullBytes, &params); err != nil || !params.KDF.Algorithm.Equal(oidPBKDF2) {
		return nil, errors.New("the encrypted private key's PBES2 parameters are not PBKDF2: re-encrypt it with openssl pkcs8 -topk8 -v2 aes-256-cbc")
	}
	var kdf pbkdf2Params
	if _, err := asn1.Unmarshal(params.KDF.Parameters.FullBytes, &kdf); err != nil {
		return nil, fmt.Errorf("the encrypted private key's PBKDF2 parameters cannot be read: %v", err)
	}
	h := prfHash(kdf.PRF.Algorithm)
	size := aesKeySize(params.Scheme.Algorithm)
	if h == nil || size == 0 {
		return nil, fmt.Errorf("the private key's encryption (%v, %v) is not supported: re-encrypt it with openssl pkcs8 -topk8 -v2 aes-256-cbc",
			kdf.PRF.Algorithm, params.Scheme.Algorithm)
	}
	var iv []byte
	if _, err := asn1.Unmarshal(params.Scheme.Parameters.FullBytes, &iv); err != nil || len(iv) != aes.BlockSize {
		return nil, errors.New("the encrypted private key's AES IV cannot be read")
	}
	if kdf.Iterations <= 0 || kdf.Iterations > 10_000_000 {
		return nil, fmt.Errorf("the encrypted private key asks for %d PBKDF2 iterations: re-encrypt it", kdf.Iterations)
	}
	key, err := pbkdf2.Key(h, string(password), kdf.Salt, kdf.Iterations, size)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	if len(info.Data) == 0 || len(info.Data)%aes.BlockSize != 0 {
		return nil, errors.New("the encrypted private key's data is not whole AES blocks")
	}
	out := make([]byte, len(info.Data))
	cipher.NewCBCDecrypter(block, iv).CryptBlocks(out, info.Data)
	pad := int(out[len(out)-1])
	if pad == 0 || pad > aes.BlockSize {
		return nil, errWrongKeyPassword
	}
	for _, b := range out[len(out)-pad:] {
		if int(b) != pad {
			return nil, errWrongKeyPassword
		}
	}
	return out[:len(out)-pad], nil
}
