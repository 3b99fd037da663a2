package kafka

import (
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// ProducerID is an idempotent producer identity.
type ProducerID struct {
	ID    int64
	Epoch int16
}

// Security returns how to secure a new connection to a cluster (TLS,
// SASL); it is called at every dial, so replaced certificate and secret
// files take effect on new connections. A nil Security is PLAINTEXT.
// An error fails the dial: it must say which setting to fix.
type Security func() (*kwire.Security, error)

// MaxIdlePerBroker bounds the pooled connections per broker address: the
// data path runs at most this many walks at once (fetch's maxWalks), each
// on one pooled connection per cluster.
const MaxIdlePerBroker = 8
