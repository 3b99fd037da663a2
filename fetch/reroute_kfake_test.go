package fetch

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestSourceReplacedDuringLookupIsFetched: a mirror's source settings
// change twice (two alters of its security settings) while a partition's
// route through the first replacement still waits on the source (its
// leader's epoch check, OffsetForLeaderEpoch).
// The partition must be fetched by the newest source's loop: the lookup's
// answer belongs to a source that has no fetch loop any more (seen on
// real Kafka: one partition of a mirror stayed MIRRORING, never fetched,
// after its certificate settings were altered).
func TestSourceReplacedDuringLookupIsFetched(t *testing.T) {
	x := newKfakePair(t)
	x.mirrorCaughtUp("t", 1, 50)

	var armed atomic.Bool
	blocked, release := make(chan struct{}), make(chan struct{})
	x.src.ControlKey(int16(kmsg.OffsetForLeaderEpoch), func(kmsg.Request) (kmsg.Response, error, bool) {
		x.src.KeepControl()
		if armed.CompareAndSwap(true, false) {
			close(blocked)
			x.src.SleepControl(func() { <-release })
		}
		return nil, nil, false
	})
	armed.Store(true)
	x.e.SetSource("m", Source{Bootstrap: x.src.ListenAddrs(), SecurityKey: "second"})
	select {
	case <-blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("no leader check (OffsetForLeaderEpoch) reached the source after its settings changed")
	}
	x.e.SetSource("m", Source{Bootstrap: x.src.ListenAddrs(), SecurityKey: "third"})
	close(release)
	// The first source's loop may still hold a long poll open that would
	// answer the records below: let it end (its loop then exits).
	time.Sleep(2 * x.e.cfg.FetchMaxWait)

	x.produce(x.src, "t", 50, 50)
	x.waitCaughtUp("t", 1)
	x.requireMirrored("t", 1)
}
