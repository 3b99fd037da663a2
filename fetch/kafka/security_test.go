package kafka

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// TestSecurityFailure: what the engine puts in FAILED, and what the
// automatic-failover probe counts as a source that answers.
func TestSecurityFailure(t *testing.T) {
	auth := fmt.Errorf("source cluster: %w", fmt.Errorf("%w: kafka broker a:1 refused user", kwire.ErrAuthentication))
	down := fmt.Errorf("connect to kafka broker a:1: %w", syscall.ECONNREFUSED)
	cases := []struct {
		err  error
		want bool
	}{
		{auth, true},
		{&kwire.Error{Code: kwire.CodeTopicAuthorizationFailed, Topic: "t"}, true},
		{fmt.Errorf("fetch: %w", &kwire.Error{Code: kwire.CodeGroupAuthorizationFailed}), true},
		{&joinedError{prefix: "source cluster refused kmirror's connection", errs: []error{down, auth}}, true},
		{&joinedError{prefix: "source cluster unreachable", errs: []error{down, errors.New("i/o timeout")}}, false},
		{&kwire.Error{Code: kwire.CodeNotLeaderOrFollower}, false},
		{down, false},
	}
	for _, c := range cases {
		if got := SecurityFailure(c.err); got != c.want {
			t.Errorf("SecurityFailure(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
