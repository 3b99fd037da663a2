package ksec

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
)

// encryptPKCS8 encrypts a PKCS#8 DER private key with password the way
// "openssl pkcs8 -topk8 -v2 aes-256-cbc" does (PBES2, PBKDF2 with
// HMAC-SHA256, AES-256-CBC) and returns the ENCRYPTED PRIVATE KEY PEM: the
// keys an operator's ssl.key.password unlocks. kmirror never encrypts keys.
func encryptPKCS8(der []byte, password string) ([]byte, error) {
	salt, iv := make([]byte, 16), make([]byte, aes.BlockSize)
	if _, err := rand.Read(salt); err != nil {
		return nil, err
	}
	if _, err := rand.Read(iv); err != nil {
		return nil, err
	}
	const iterations = 2048
	key, err := pbkdf2.Key(sha256.New, password, salt, iterations, 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	pad := aes.BlockSize - len(der)%aes.BlockSize
	plain := append(append([]byte(nil), der...), bytes.Repeat([]byte{byte(pad)}, pad)...)
	data := make([]byte, len(plain))
	cipher.NewCBCEncrypter(block, iv).CryptBlocks(data, plain)
	kdf, err := asn1.Marshal(pbkdf2Params{Salt: salt, Iterations: iterations, KeyLength: 32,
		PRF: pkix.AlgorithmIdentifier{Algorithm: oidHMACWithSHA256, Parameters: asn1.NullRawValue}})
	if err != nil {
		return nil, err
	}
	ivDER, err := asn1.Marshal(iv)
	if err != nil {
		return nil, err
	}
	params, err := asn1.Marshal(pbes2Params{
		KDF:    pkix.AlgorithmIdentifier{Algorithm: oidPBKDF2, Parameters: asn1.RawValue{FullBytes: kdf}},
		Scheme: pkix.AlgorithmIdentifier{Algorithm: oidAES256CBC, Parameters: asn1.RawValue{FullBytes: ivDER}},
	})
	if err != nil {
		return nil, err
	}
	out, err := asn1.Marshal(encryptedPrivateKeyInfo{
		Algorithm: pkix.AlgorithmIdentifier{Algorithm: oidPBES2, Parameters: asn1.RawValue{FullBytes: params}},
		Data:      data,
	})
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: out}), nil
}
