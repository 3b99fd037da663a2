package fetch

import (
	"testing"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// TestClassifyProduceError pins which produce errors may follow an append
// (confirm before resending) and which come only before it (resend as is);
// fetch/DESIGN.md fact 4 gives the broker code behind each.
func TestClassifyProduceError(t *testing.T) {
	cases := []struct {
		name string
		code int16
		want produceAction
	}{
		{"not enough replicas: checked before the append", kwire.CodeNotEnoughReplicas, resendAsIs},
		{"leader not available", kwire.CodeLeaderNotAvailable, resendRerouted},
		{"unknown topic or partition on this broker", kwire.CodeUnknownTopicOrPartition, resendRerouted},
		{"not leader: also sent by DelayedProduce after the append", kwire.CodeNotLeaderOrFollower, confirmFirst},
		{"request timed out waiting for the ISR", kwire.CodeRequestTimedOut, confirmFirst},
		{"not enough replicas after append", kwire.CodeNotEnoughReplicasAfter, confirmFirst},
		{"storage error", kwire.CodeKafkaStorageError, confirmFirst},
		{"network exception", kwire.CodeNetworkException, confirmFirst},
		{"duplicate sequence: already in", kwire.CodeDuplicateSequence, confirmFirst},
		{"out of order sequence", kwire.CodeOutOfOrderSequence, renewIdentity},
		{"unknown producer ID", kwire.CodeUnknownProducerID, renewIdentity},
		{"message too large", kwire.CodeMessageTooLarge, failPartition},
		{"corrupt message", kwire.CodeCorruptMessage, failPartition},
		{"invalid timestamp", kwire.CodeInvalidTimestamp, failPartition},
		{"fenced epoch: the identity was renewed through raft; hand back", kwire.CodeInvalidProducerEpoch, renewIdentity},
		{"an error code nobody planned for", 9999, failPartition},
	}
	for _, c := range cases {
		if got := classifyProduceError(c.code); got != c.want {
			t.Errorf("%s (code %d): got %d, want %d", c.name, c.code, got, c.want)
		}
	}
}
