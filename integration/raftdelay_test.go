package integration

import (
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/owner"
	"github.com/kmirror/kmirror/integration/harness"
)

// TestGroupLateRaftAnswers: a member's raft answers are held past the
// raft transport's timeout on a live link (a proxy in front of its raft
// listener delays what it sends back, 3 s), while the leader's requests
// reach it at once. The member keeps hearing from the leader, so raft's
// own contact stays fresh on its side, but the leader's heartbeats to it
// fail: it grants the member no lease, and takes its partitions over once
// lease_ttl has passed since its last grant. The member must have fenced
// itself before (issue 19: it renewed by raft's contact, never fenced,
// and two members wrote); nothing is lost or written twice, and once its
// answers come on time it holds a lease again.
func TestGroupLateRaftAnswers(t *testing.T) {
	proxies := map[int]*harness.DelayProxy{}
	g := startGroupAdvertising(t, "rd", 3, func(int) memberOpts { return memberOpts{} }, func(i int, listen string) string {
		p, err := harness.NewDelayProxy(listen)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		proxies[i] = p
		return p.Addr()
	})
	m0 := g.members[0]
	const topic, partitions, n = "rd", 6, 60_000
	wait := mirrorStreams(t, m0, "rd", []string{topic}, partitions, n, 3_000)
	waitBalanced(t, m0, "rd", "rd-1", "rd-2", "rd-3")
	slow, watcher := g.followerAndWatcher()
	for i, m := range g.members {
		if m == slow {
			proxies[i].SetReplyDelay(3 * time.Second)
		}
	}
	t.Logf("holding %s's raft answers 3 s", memberID(slow))
	t.Logf("taken over %s after its answers were held", waitTakenOver(t, watcher, "rd", memberID(slow)))
	if logCount(t, slow, owner.LogLeaseLost) == 0 {
		t.Fatalf("%s's partitions were taken over but it never fenced itself:\n%s", memberID(slow), slow.logTail())
	}
	for _, p := range proxies {
		p.SetReplyDelay(0)
	}
	wait()
	for _, m := range g.members {
		waitCaughtUp(t, m, "rd", topic)
	}
	requireSameRecords(t, readAll(t, env.src, topic, partitions, true), readAll(t, env.dst, topic, partitions, true))
	requireSequencesContiguous(t, env.dst, topic, partitions)
	requireCheckpointsForward(t, env.dst, topic)
	deadline := time.Now().Add(30 * time.Second)
	for logCount(t, slow, owner.LogLeaseRegained) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s holds no lease 30 s after its answers came on time again:\n%s", memberID(slow), slow.logTail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}
