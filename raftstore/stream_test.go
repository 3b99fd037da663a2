package raftstore

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
)

// TestHandshakeHint: a failed raft TLS handshake names its likely cause,
// so `kmirror members` does not send an operator after certificates for a
// member that is only frozen or runs without raft_tls.
func TestHandshakeHint(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{context.DeadlineExceeded, "not a certificate problem"},
		{&net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, "not a certificate problem"},
		{io.EOF, "is raft_tls set on it too"},
		{&net.OpError{Op: "read", Err: syscall.ECONNRESET}, "is raft_tls set on it too"},
		{fmt.Errorf("tls: failed to verify certificate: %w", x509.UnknownAuthorityError{}), "must be signed by ca_file"},
	} {
		if got := handshakeHint(c.err); !strings.Contains(got, c.want) {
			t.Errorf("handshakeHint(%v) = %q, want it to say %q", c.err, got, c.want)
		}
	}
}

// TestReadError: a failed read on a dialed raft connection says what it
// most likely means (a frozen member is a timeout, not a TLS problem).
func TestReadError(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, "no answer in time"},
		{io.EOF, "it restarted or stopped"},
		{&net.OpError{Op: "remote error", Err: errors.New("tls: certificate required")}, "refused by it"},
	} {
		if got := readError("127.0.0.1:7000", c.err).Error(); !strings.Contains(got, c.want) {
			t.Errorf("readError(%v) = %q, want it to say %q", c.err, got, c.want)
		}
	}
}
