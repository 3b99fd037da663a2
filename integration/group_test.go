package integration

import (
	"context"
	"fmt"
	"math/rand"
	"net/http"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon"
	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/owner"
	"github.com/kmirror/kmirror/integration/harness"
)

// TestGroupMemberFaults runs a 3-member group through the member faults a
// group must survive while a stream is mirrored: SIGKILL of a follower and
// of the raft leader, and a SIGTERM (graceful handoff). Every admin request
// goes to a follower (forwarded to the leader), describe is asked of every
// member, and the clusters are compared record by record.
func TestGroupMemberFaults(t *testing.T) {
	g := startGroup(t, "grp", 3)
	m0 := g.members[0]
	// Each member shows "not started" until its own announce has reached
	// the leader, moments after it is ready.
	var rows []api.MemberStatus
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		rows = g.memberRows(m0)
		roles, alive := map[string]int{}, 0
		for _, r := range rows {
			roles[r.Role]++
			if r.State == "alive" {
				alive++
			}
		}
		if len(rows) == 3 && roles["leader"] == 1 && roles["follower"] == 2 && alive == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kmirror members: %+v, want one leader and two followers, all alive", rows)
		}
	}
	leader := g.leaderID(m0)
	var follower *member
	for _, r := range rows {
		if r.Role == "follower" {
			follower = g.byID(r.ID)
			break
		}
	}
	// Writes sent to a follower are forwarded to the leader.
	topics := []string{"grp-a", "grp-b", "grp-c"}
	const partitions, perTopic = 4, 50_000
	wait := mirrorStreams(t, follower, "grp", topics, partitions, perTopic, 2_500)
	ids := []string{"grp-1", "grp-2", "grp-3"}
	own := waitBalanced(t, m0, "grp", ids...)
	t.Logf("leader %s; owners %v", leader, own)

	// 1. SIGKILL a follower that holds partitions; restart it once the
	// others have taken its partitions over.
	other := g.members[0]
	if other == follower {
		other = g.members[1]
	}
	follower.kill9()
	t.Logf("killed follower %s", follower.cfgPath)
	t.Logf("takeover after kill -9 of a follower: %s", waitTakenOver(t, other, "grp", memberID(follower)))
	follower.start()

	// 2. SIGKILL the raft leader.
	lm := g.byID(leader)
	lm.kill9()
	t.Logf("killed leader %s", leader)
	other = g.members[0]
	if other == lm {
		other = g.members[1]
	}
	t.Logf("takeover after kill -9 of the leader: %s", waitTakenOver(t, other, "grp", leader))
	lm.start()

	// 3. SIGTERM a member: it hands its partitions off before it exits.
	newLeader := g.leaderID(other)
	var calm *member
	for _, m := range g.members {
		if !strings.Contains(m.cfgPath, "/"+newLeader+"/") {
			calm = m
		}
	}
	waitBalanced(t, other, "grp", ids...)
	calm.stop()
	time.Sleep(2 * time.Second)
	calm.start()

	// 4. SIGTERM the raft leader: it hands leadership on before it closes
	// its API, through which the others renew their leases, so none of
	// them loses its lease (issue 18: it shut its API first and left the
	// group without a leader until an election by timeout).
	waitBalanced(t, other, "grp", ids...)
	lead := g.byID(g.leaderID(other))
	lost := map[*member]int{}
	for _, m := range g.members {
		lost[m] = logCount(t, m, owner.LogLeaseLost)
	}
	lead.stop()
	if logCount(t, lead, daemon.LogLeadershipHandedOn) == 0 {
		t.Fatalf("the leader stopped without handing raft leadership on; log:\n%s", lead.logTail())
	}
	for _, m := range g.members {
		if m != lead && logCount(t, m, owner.LogLeaseLost) != lost[m] {
			t.Fatalf("%s lost its lease while the leader stopped", memberID(m))
		}
	}
	lead.start()

	wait()
	waitBalanced(t, m0, "grp", ids...)
	// describe from every member shows every partition caught up.
	for _, m := range g.members {
		waitCaughtUp(t, m, "grp", topics...)
	}
	for _, topic := range topics {
		src := readAll(t, env.src, topic, partitions, true)
		n := 0
		for _, p := range src {
			n += len(p)
		}
		if n != perTopic {
			t.Fatalf("source %s holds %d records, want %d", topic, n, perTopic)
		}
		requireSameRecords(t, src, readAll(t, env.dst, topic, partitions, true))
		requireSequencesContiguous(t, env.dst, topic, partitions)
		requireCheckpointsForward(t, env.dst, topic)
	}
	takeovers, handoffs, walked := 0, 0, 0
	for _, m := range g.members {
		takeovers += logCount(t, m, "partition taken over from an unreachable member")
		handoffs += logCount(t, m, "partition taken over by handoff")
		walked += resumeWalks(t, m)
	}
	t.Logf("takeovers %d, exact handoffs %d, resumes that walked past a checkpoint %d", takeovers, handoffs, walked)
	if takeovers < 8 || handoffs == 0 {
		t.Fatalf("takeovers %d (want the 8 partitions of the two killed members), handoffs %d: the faults did not exercise both paths", takeovers, handoffs)
	}
}

// TestGroupZombie stops (SIGSTOP) a member that holds partitions for
// longer than the lease, lets the others take over and write, then
// resumes it (SIGCONT). The destination must equal the source, and must
// show that the stopped member wrote nothing after its partitions moved
// (requireSequencesContiguous).
func TestGroupZombie(t *testing.T) {
	g := startGroup(t, "zmb", 3)
	m0 := g.members[0]
	const topic, partitions, n = "zmb", 6, 90_000
	wait := mirrorStreams(t, m0, "zmb", []string{topic}, partitions, n, 4_000)
	ids := []string{"zmb-1", "zmb-2", "zmb-3"}
	waitBalanced(t, m0, "zmb", ids...)
	time.Sleep(2 * time.Second)
	zombie, watcher := g.followerAndWatcher()
	zombieID := memberID(zombie)
	held := owners(t, watcher, "zmb")
	zombie.cmd.Process.Signal(syscall.SIGSTOP)
	t.Logf("stopped %s (SIGSTOP); it held %v", zombieID, held)
	deadline := time.Now().Add(60 * time.Second)
	for {
		moved := true
		for _, o := range owners(t, watcher, "zmb") {
			if o == zombieID {
				moved = false
			}
		}
		if moved {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partitions of the stopped member not taken over within 60s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// members says why raft cannot reach it: a timeout (frozen), not a
	// refusal.
	for _, r := range g.memberRows(watcher) {
		if r.ID == zombieID && (r.State != "unreachable" || !strings.Contains(r.Error, "no answer in time")) {
			t.Fatalf("members shows the stopped member as %+v; want unreachable with an error saying it does not answer", r)
		}
	}
	time.Sleep(3 * time.Second) // the new owners write
	zombie.cmd.Process.Signal(syscall.SIGCONT)
	t.Logf("resumed %s (SIGCONT)", zombieID)
	wait()
	for _, m := range g.members {
		waitCaughtUp(t, m, "zmb", topic)
	}
	src := readAll(t, env.src, topic, partitions, true)
	dst := readAll(t, env.dst, topic, partitions, true)
	requireSameRecords(t, src, dst)
	requireSequencesContiguous(t, env.dst, topic, partitions)
	requireCheckpointsForward(t, env.dst, topic)
	if logCount(t, zombie, owner.LogLeaseLost) == 0 {
		t.Fatalf("the stopped member never noticed it lost its lease:\n%s", zombie.logTail())
	}
}

// TestGroupRaftIsolation cuts one member's raft traffic with the test hook
// while its Kafka connections stay up: it must fence itself (write
// nothing) before the others take its partitions over, and write again
// only once its state has caught up after the cut ends.
func TestGroupRaftIsolation(t *testing.T) {
	g := startGroup(t, "iso", 3)
	m0 := g.members[0]
	const topic, partitions, n = "iso", 6, 60_000
	wait := mirrorStreams(t, m0, "iso", []string{topic}, partitions, n, 3_000)
	ids := []string{"iso-1", "iso-2", "iso-3"}
	waitBalanced(t, m0, "iso", ids...)
	cut, watcher := g.followerAndWatcher()
	isolate := func(on bool) {
		t.Helper()
		resp, err := cut.httpc.Post(fmt.Sprintf("%s/v1/internal/test/raft-isolation?on=%t", cut.url, on), "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("raft isolation hook: %s", resp.Status)
		}
	}
	isolate(true)
	t.Logf("cut the raft traffic of %s", memberID(cut))
	t.Logf("takeover after the cut: %s", waitTakenOver(t, watcher, "iso", memberID(cut)))
	isolate(false)
	wait()
	for _, m := range g.members {
		waitCaughtUp(t, m, "iso", topic)
	}
	requireSameRecords(t, readAll(t, env.src, topic, partitions, true), readAll(t, env.dst, topic, partitions, true))
	requireSequencesContiguous(t, env.dst, topic, partitions)
	requireCheckpointsForward(t, env.dst, topic)
	if logCount(t, cut, owner.LogLeaseLost) == 0 ||
		logCount(t, cut, owner.LogLeaseRegained) == 0 {
		t.Fatalf("the cut member did not fence itself and sync again:\n%s", cut.logTail())
	}
}

// TestGroupJoinDrainLeave adds a fourth member while a stream is mirrored:
// it receives partitions by graceful handoff, none of them with a walk.
// Then a member is drained (all its partitions move away by handoff) and
// removed from the group. No record is lost or written twice.
func TestGroupJoinDrainLeave(t *testing.T) {
	g := startGroup(t, "jdl", 3)
	m0 := g.members[0]
	const topic, partitions, n = "jdl", 8, 80_000
	wait := mirrorStreams(t, m0, "jdl", []string{topic}, partitions, n, 3_000)
	waitBalanced(t, m0, "jdl", "jdl-1", "jdl-2", "jdl-3")
	// Every partition running (a partition still starting is handed over
	// without a checkpoint, and its next owner walks).
	waitTakenOver(t, m0, "jdl", "none")

	// Join: add the member to the group, then start it.
	httpAddr, raftAddr := freeAddr(t), freeAddr(t)
	if out, errOut, code := cli(t, m0, "members", "add", "jdl-4", "--raft", raftAddr, "--http", httpAddr); code != 0 {
		t.Fatalf("members add: %s%s", out, errOut)
	}
	peers := "peers:\n" + strings.Join(g.peers, "") + fmt.Sprintf("  - {id: jdl-4, raft: \"%s\", http: \"%s\"}\n", raftAddr, httpAddr)
	m4 := startMember(t, "jdl-4", memberOpts{extra: peers + groupLease, httpAddr: httpAddr, raftAddr: raftAddr})
	g.members = append(g.members, m4)
	waitBalanced(t, m0, "jdl", "jdl-1", "jdl-2", "jdl-3", "jdl-4")
	for deadline := time.Now().Add(30 * time.Second); logCount(t, m4, "partition taken over by handoff") < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("the new member took %d partitions by handoff within 30s, want 2", logCount(t, m4, "partition taken over by handoff"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := logCount(t, m4, "partition resumed"); got != 0 {
		t.Fatalf("the new member resumed %d partitions with a walk: handoffs must not walk", got)
	}

	// Drain, then remove, jdl-2.
	if out, errOut, code := cli(t, m4, "members", "drain", "jdl-2"); code != 0 {
		t.Fatalf("members drain: %s%s", out, errOut)
	}
	waitBalanced(t, m4, "jdl", "jdl-1", "jdl-3", "jdl-4")
	for _, r := range g.memberRows(m4) {
		if r.ID == "jdl-2" && (r.State != "draining" || r.Partitions != 0) {
			t.Fatalf("drained member: %+v, want draining with 0 partitions", r)
		}
	}
	if out, errOut, code := cli(t, m4, "members", "remove", "jdl-2"); code != 0 {
		t.Fatalf("members remove: %s%s", out, errOut)
	}
	g.byID("jdl-2").stop()
	rows := g.memberRows(m4)
	if len(rows) != 3 {
		t.Fatalf("members after remove: %+v, want jdl-1, jdl-3, jdl-4", rows)
	}
	// A member added but never started gets no partition, even when a
	// member leaves and partitions move; nor does the removed one.
	// (A non-voter: a voter that never starts would count toward the
	// quorum, and the stop below would leave two of four voters.)
	if out, errOut, code := cli(t, m4, "members", "add", "jdl-5", "--raft", freeAddr(t), "--http", freeAddr(t), "--non-voter"); code != 0 {
		t.Fatalf("members add: %s%s", out, errOut)
	}
	g.byID("jdl-3").stop() // its partitions are handed to the others
	waitBalanced(t, m4, "jdl", "jdl-1", "jdl-4")
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		for p, o := range owners(t, m4, "jdl") {
			if o == "jdl-2" || o == "jdl-5" {
				t.Fatalf("partition %s given to %s (removed, or added and never started)", p, o)
			}
		}
	}
	for _, r := range g.memberRows(m4) {
		if r.ID == "jdl-5" && (r.State != "not started" || r.Partitions != 0) {
			t.Fatalf("member added and never started: %+v, want not started with no partitions", r)
		}
	}
	if out, errOut, code := cli(t, m4, "members", "remove", "jdl-5"); code != 0 {
		t.Fatalf("members remove of a member never started: %s%s", out, errOut)
	}
	if _, errOut, code := cli(t, m4, "members", "remove", "nosuch"); code != 1 || !strings.Contains(errOut, "member nosuch is not in the group") {
		t.Fatalf("members remove of an unknown ID: exit %d, %q", code, errOut)
	}
	g.byID("jdl-3").start()
	wait()
	waitBalanced(t, m4, "jdl", "jdl-1", "jdl-3", "jdl-4")
	for _, m := range []*member{g.byID("jdl-1"), g.byID("jdl-3"), m4} {
		waitCaughtUp(t, m, "jdl", topic)
	}
	requireSameRecords(t, readAll(t, env.src, topic, partitions, true), readAll(t, env.dst, topic, partitions, true))
	requireSequencesContiguous(t, env.dst, topic, partitions)
	requireCheckpointsForward(t, env.dst, topic)
	gaps := handoffGaps(t, g.members)
	if len(gaps) == 0 {
		t.Fatal("no handoff found in the members' logs")
	}
	t.Logf("gap per partition during a graceful handoff (old owner starts draining -> new owner mirrors) over %d handoffs: median %s, max %s",
		len(gaps), gaps[len(gaps)/2], gaps[len(gaps)-1])
}

// TestGroupRemoveSurvivesKill sends remove to a follower that owns
// partitions and kills it with SIGKILL 25 ms later, while records are still
// produced. STOPPING lives in the replicated state: after the restart (and
// the takeover of the killed member's partitions) every partition ends
// STOPPED, and each recorded last mirrored position is exactly where the
// destination ends, holding the source's records up to it.
func TestGroupRemoveSurvivesKill(t *testing.T) {
	g := startGroup(t, "rmk", 3)
	ctx := context.Background()
	m0 := g.members[0]
	const topic, partitions = "rmk", 6
	mirrorStreams(t, m0, "rmk", []string{topic}, partitions, 20_000, 0)
	waitBalanced(t, m0, "rmk", "rmk-1", "rmk-2", "rmk-3")
	waitCaughtUp(t, m0, "rmk", topic)
	wait := streamRecords(t, topic, 20_000, 4_000)
	time.Sleep(time.Second)
	victim, watcher := g.followerAndWatcher()
	done := make(chan string, 1)
	go func() {
		// In-process, not the CLI: a CLI process may take longer than
		// 25 ms to start on a loaded machine, and the request would never
		// reach the member.
		err := victim.client.RemoveTopic(ctx, "rmk", topic)
		done <- fmt.Sprint(err)
	}()
	time.Sleep(25 * time.Millisecond)
	victim.kill9()
	t.Logf("remove sent to %s, killed 25 ms later (the client said %q)", memberID(victim), <-done)
	time.Sleep(2 * time.Second)
	victim.start()
	deadline := time.Now().Add(90 * time.Second)
	var rows []api.PartitionStatus
	for {
		var err error
		rows, err = watcher.client.Describe(ctx, "rmk", topic)
		stopped := err == nil && len(rows) == partitions
		for _, r := range rows {
			if r.State != "STOPPED" {
				stopped = false
			}
		}
		if stopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic not STOPPED within 90s of remove and a kill of its member: %+v (%v)", rows, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	wait()
	src := readAll(t, env.src, topic, partitions, true)
	dst := readAll(t, env.dst, topic, partitions, true)
	for _, r := range rows {
		p := r.Partition
		if r.SourceOffset != int64(len(dst[p])) || r.DestinationOffset != int64(len(dst[p])) {
			t.Fatalf("partition %d stopped at source %d, destination %d, but the destination holds %d records",
				p, r.SourceOffset, r.DestinationOffset, len(dst[p]))
		}
		src[p] = src[p][:len(dst[p])]
	}
	requireSameRecords(t, src, dst)
}

// TestGroupRollingKill mirrors over a million records over 24 partitions in
// three topics while a random member, the raft leader included, is killed
// with SIGKILL again and again (each restarted once the others have taken
// its partitions over, so a quorum is kept). It prints the takeover times
// (kill to every partition mirroring again under a new owner).
func TestGroupRollingKill(t *testing.T) {
	g := startGroup(t, "roll", 3)
	topics := []string{"roll-a", "roll-b", "roll-c"}
	const partitions, perTopic, kills = 8, 340_000, 10
	wait := mirrorStreams(t, g.members[0], "roll", topics, partitions, perTopic, 4_000)
	waitBalanced(t, g.members[0], "roll", "roll-1", "roll-2", "roll-3")
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("kill schedule seed %d", seed)
	var takeovers []time.Duration
	for i := 0; i < kills; i++ {
		time.Sleep(time.Duration(500+rng.Intn(2000)) * time.Millisecond)
		victim := g.members[rng.Intn(len(g.members))]
		var watcher *member
		for _, m := range g.members {
			if m != victim {
				watcher = m
			}
		}
		role := "follower"
		if g.leaderID(watcher) == memberID(victim) {
			role = "leader"
		}
		victim.kill9()
		d := waitTakenOver(t, watcher, "roll", memberID(victim))
		t.Logf("kill %d: %s (%s), partitions taken over in %s", i+1, memberID(victim), role, d)
		takeovers = append(takeovers, d)
		victim.start()
	}
	wait()
	for _, m := range g.members {
		waitCaughtUp(t, m, "roll", topics...)
	}
	total := 0
	for _, topic := range topics {
		src := readAll(t, env.src, topic, partitions, true)
		for _, p := range src {
			total += len(p)
		}
		requireSameRecords(t, src, readAll(t, env.dst, topic, partitions, true))
		requireSequencesContiguous(t, env.dst, topic, partitions)
		requireCheckpointsForward(t, env.dst, topic)
	}
	if total < 1_000_000 {
		t.Fatalf("%d records mirrored, want at least a million", total)
	}
	sort.Slice(takeovers, func(i, j int) bool { return takeovers[i] < takeovers[j] })
	t.Logf("takeover after kill -9 over %d kills (lease_ttl 6s): median %s, max %s", len(takeovers), takeovers[len(takeovers)/2], takeovers[len(takeovers)-1])
}

// TestGroupTakeoverConnections kills a member that holds 80 partitions and
// counts the connections the others open to the destination (through the
// harness proxy) while they take over: the resume walks run a few at a time
// on pooled connections, not two fresh connections per partition.
func TestGroupTakeoverConnections(t *testing.T) {
	ctx := context.Background()
	dst, err := harness.Start(ctx, harness.Options{Name: "conns-destination", BrokerProps: brokerProps, Proxy: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	g := startGroupTo(t, "cns", 3, dst.Bootstrap())
	const topic, partitions = "cns", 240
	mirrorStreams(t, g.members[0], "cns", []string{topic}, partitions, 24_000, 0)
	for _, m := range g.members {
		m.src = env.src
	}
	waitBalanced(t, g.members[0], "cns", "cns-1", "cns-2", "cns-3")
	waitCaughtUp(t, g.members[0], "cns", topic)
	victim, watcher := g.followerAndWatcher()
	held := 0
	for _, o := range owners(t, watcher, "cns") {
		if o == memberID(victim) {
			held++
		}
	}
	before := dst.Proxy(0).Accepted()
	victim.kill9()
	d := waitTakenOver(t, watcher, "cns", memberID(victim))
	opened := dst.Proxy(0).Accepted() - before
	t.Logf("took over %d partitions in %s opening %d destination connections", held, d, opened)
	if opened > 30 {
		t.Fatalf("taking over %d partitions opened %d destination connections, want a few (walks share pooled connections)", held, opened)
	}
	victim.start()
	for _, m := range g.members {
		waitCaughtUp(t, m, "cns", topic)
	}
	requireSameRecords(t, readAll(t, env.src, topic, partitions, true), readAll(t, dst, topic, partitions, true))
}
