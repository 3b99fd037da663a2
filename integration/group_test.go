package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
	"github.com/kmirror/kmirror/integration/harness"
)

// groupLease is the lease configuration of test groups: shorter than the
// defaults so takeovers happen within seconds, with the same ordering
// (produce timeout < margin < TTL).
const groupLease = "lease_ttl: 6s\nlease_margin: 3s\nproduce_timeout: 2s\ntest_hooks: true\n"

// kgroup is a kmirror group of daemon processes with a shared peers list.
type kgroup struct {
	t       *testing.T
	members []*member
	peers   []string // the peers list entries, one YAML line each
}

// startGroup starts n members named name-1..name-n and waits until all are
// ready (a new group forms once a quorum is up).
func startGroup(t *testing.T, name string, n int) *kgroup {
	t.Helper()
	return startGroupTo(t, name, n, "")
}

// startGroupTo is startGroup with another destination cluster ("": the
// shared one).
func startGroupTo(t *testing.T, name string, n int, destination string) *kgroup {
	t.Helper()
	return startGroupWith(t, name, n, memberOpts{destination: destination})
}

// startGroupWith is startGroup with every member's options based on base
// (its extra YAML comes after the peers list).
func startGroupWith(t *testing.T, name string, n int, base memberOpts) *kgroup {
	t.Helper()
	g := &kgroup{t: t}
	type addrs struct{ http, raft string }
	as := make([]addrs, n)
	for i := range as {
		as[i] = addrs{freeAddr(t), freeAddr(t)}
		g.peers = append(g.peers, fmt.Sprintf("  - {id: %s-%d, raft: \"%s\", http: \"%s\"}\n", name, i+1, as[i].raft, as[i].http))
	}
	for i := range n {
		o := base
		o.extra = "peers:\n" + strings.Join(g.peers, "") + groupLease + base.extra
		o.httpAddr, o.raftAddr, o.noWait = as[i].http, as[i].raft, true
		m := startMember(t, fmt.Sprintf("%s-%d", name, i+1), o)
		g.members = append(g.members, m)
	}
	for _, m := range g.members {
		m.waitReady()
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, m := range g.members {
			state := "running"
			select {
			case <-m.exited:
				state = fmt.Sprintf("exited: %v", m.exitErr)
			default:
				if m.cmd == nil {
					state = "not running"
				}
			}
			t.Logf("member %s (%s), log tail:\n%s", memberID(m), state, m.logTail())
		}
	})
	return g
}

// mirrorStreams, through member m: creates the mirror name on the shared
// source, creates each topic there with the given partitions, streams
// perTopic records into each at rate records/s (rate 0: all of them before
// the topics are added) and adds the topics. wait returns once every
// record is acknowledged by the source.
func mirrorStreams(t *testing.T, m *member, name string, topics []string, partitions, perTopic, rate int) (wait func()) {
	t.Helper()
	ctx := context.Background()
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{
		Name: name, Properties: map[string]string{"bootstrap.servers": env.src.Bootstrap()},
	}); err != nil {
		t.Fatalf("create mirror %s through %s: %v", name, memberID(m), err)
	}
	var waits []func()
	for _, topic := range topics {
		if err := env.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
			t.Fatal(err)
		}
		if rate == 0 {
			streamRecords(t, topic, perTopic, perTopic)()
			continue
		}
		waits = append(waits, streamRecords(t, topic, perTopic, rate))
	}
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: name, Topics: topics}); err != nil {
		t.Fatalf("add %v through %s: %v", topics, memberID(m), err)
	}
	return func() {
		for _, w := range waits {
			w()
		}
	}
}

// followerAndWatcher returns a member that is not the raft leader (the one
// a test stops, cuts or kills) and another member to watch from.
func (g *kgroup) followerAndWatcher() (follower, watcher *member) {
	g.t.Helper()
	leader := g.leaderID(g.members[0])
	for _, m := range g.members {
		switch {
		case follower == nil && memberID(m) != leader:
			follower = m
		case m != follower:
			watcher = m
		}
	}
	return follower, watcher
}

// byID returns the member with node_id id.
func (g *kgroup) byID(id string) *member {
	g.t.Helper()
	for _, m := range g.members {
		if strings.HasSuffix(m.cfgPath, "/"+id+"/kmirror.yaml") {
			return m
		}
	}
	g.t.Fatalf("no member %s", id)
	return nil
}

// members runs `kmirror members --output json` against m.
func (g *kgroup) memberRows(m *member) []api.MemberStatus {
	g.t.Helper()
	var rows []api.MemberStatus
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, errOut, code := cli(g.t, m, "--output", "json", "members")
		if code == 0 {
			if err := json.Unmarshal([]byte(out), &rows); err != nil {
				g.t.Fatalf("members output: %v\n%s", err, out)
			}
			return rows
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("kmirror members failed: %s", errOut)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// leaderID is the raft leader's ID as m sees it.
func (g *kgroup) leaderID(m *member) string {
	for _, r := range g.memberRows(m) {
		if r.Role == "leader" {
			return r.ID
		}
	}
	g.t.Fatal("no leader in kmirror members")
	return ""
}

// owners maps each partition of the topics to its owner, as m describes.
func owners(t *testing.T, m *member, mirror string) map[string]string {
	t.Helper()
	rows, err := m.client.Describe(context.Background(), mirror, "")
	for deadline := time.Now().Add(30 * time.Second); errors.Is(err, api.ErrNotLeader) && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond) // a leader election is going on
		rows, err = m.client.Describe(context.Background(), mirror, "")
	}
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, r := range rows {
		out[fmt.Sprintf("%s/%d", r.Topic, r.Partition)] = r.Owner
	}
	return out
}

// waitBalanced waits until every partition of the mirror is owned by one of
// the named members and their counts differ by at most one.
func waitBalanced(t *testing.T, m *member, mirror string, ids ...string) map[string]string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		own := owners(t, m, mirror)
		count := map[string]int{}
		for _, o := range own {
			count[o]++
		}
		lo, hi, listed := 1<<30, -1, 0
		for _, id := range ids {
			lo, hi = min(lo, count[id]), max(hi, count[id])
			listed += count[id]
		}
		if listed == len(own) && hi-lo <= 1 && len(own) > 0 {
			return own
		}
		if time.Now().After(deadline) {
			t.Fatalf("partitions not balanced over %v within 60s: %v", ids, count)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// memberID is m's node_id: the name of the folder holding its config.
func memberID(m *member) string { return filepath.Base(filepath.Dir(m.cfgPath)) }

// waitTakenOver waits until no partition of the mirror is owned by id and
// every one is MIRRORING again, as m describes it, and returns how long
// that took.
func waitTakenOver(t *testing.T, m *member, mirror, id string) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(90 * time.Second)
	for {
		rows, err := m.client.Describe(context.Background(), mirror, "")
		done := err == nil
		for _, r := range rows {
			if r.Owner == id || r.Owner == "" || r.State != "MIRRORING" || strings.HasPrefix(r.Reason, "resuming") {
				done = false
			}
		}
		if done {
			return time.Since(start).Round(100 * time.Millisecond)
		}
		if time.Now().After(deadline) {
			t.Fatalf("partitions of %s not taken over within 90s: %+v (%v)", id, rows, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// logLine is the part of a member's JSON log line the tests read.
type logLine struct {
	Msg       string `json:"msg"`
	Time      string `json:"time"`
	Partition string `json:"partition"`
	Walked    int64  `json:"walked_records"`
}

// logLines returns m's log lines with the given message, in order.
func logLines(t *testing.T, m *member, msg string) []logLine {
	t.Helper()
	b, err := os.ReadFile(m.logPath)
	if err != nil {
		t.Fatal(err)
	}
	var out []logLine
	for _, line := range strings.Split(string(b), "\n") {
		var e logLine
		if json.Unmarshal([]byte(line), &e) == nil && e.Msg == msg {
			out = append(out, e)
		}
	}
	return out
}

// logCount counts log lines of m with the given message.
func logCount(t *testing.T, m *member, msg string) int {
	t.Helper()
	return len(logLines(t, m, msg))
}

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
	if logCount(t, zombie, "lease lost: no contact with the raft leader within lease_ttl - lease_margin; writing nothing until the state is synced again") == 0 {
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
	if logCount(t, cut, "lease lost: no contact with the raft leader within lease_ttl - lease_margin; writing nothing until the state is synced again") == 0 ||
		logCount(t, cut, "lease regained: state synced with the raft leader") == 0 {
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
	gaps := handoffGaps(t, g.members)
	if len(gaps) == 0 {
		t.Fatal("no handoff found in the members' logs")
	}
	t.Logf("gap per partition during a graceful handoff (old owner starts draining -> new owner mirrors) over %d handoffs: median %s, max %s",
		len(gaps), gaps[len(gaps)/2], gaps[len(gaps)-1])
}

// logEvent is one log line of a member: when, and for which partition.
type logEvent struct {
	at        time.Time
	partition string
}

// logEvents returns when m logged msg, and for which partition.
func logEvents(t *testing.T, m *member, msg string) []logEvent {
	t.Helper()
	var out []logEvent
	for _, l := range logLines(t, m, msg) {
		at, err := time.Parse(time.RFC3339Nano, l.Time)
		if err != nil {
			t.Fatalf("log time %q: %v", l.Time, err)
		}
		out = append(out, logEvent{at, l.Partition})
	}
	return out
}

// handoffGaps pairs each "partition taken over by handoff" with the latest
// "handoff started" of the same partition before it (any member) and
// returns the gaps, sorted.
func handoffGaps(t *testing.T, members []*member) []time.Duration {
	t.Helper()
	var starts, takes []logEvent
	for _, m := range members {
		starts = append(starts, logEvents(t, m, "handoff started")...)
		takes = append(takes, logEvents(t, m, "partition taken over by handoff")...)
	}
	var gaps []time.Duration
	for _, tk := range takes {
		var best time.Time
		for _, st := range starts {
			if st.partition == tk.partition && !st.at.After(tk.at) && st.at.After(best) {
				best = st.at
			}
		}
		if !best.IsZero() {
			gaps = append(gaps, tk.at.Sub(best))
		}
	}
	sort.Slice(gaps, func(i, j int) bool { return gaps[i] < gaps[j] })
	return gaps
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

// requireSequencesContiguous reads the destination's record batches and
// fails unless, in every partition, the batches of each producer identity
// carry contiguous sequence numbers in offset order. Owners that take a
// partition over keep its identity and continue its sequence, so a batch
// written late by an owner that had lost the partition (a zombie) would
// repeat an earlier sequence range: this shows from the destination that
// no such batch landed.
func requireSequencesContiguous(t *testing.T, cl *harness.Cluster, topic string, partitions int) {
	t.Helper()
	ctx := context.Background()
	conn, err := kwire.Dial(ctx, cl.BrokerAddrs()[0], "kmirror-test", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	batches := 0
	for p := range partitions {
		type identity struct {
			id    int64
			epoch int16
		}
		next := map[identity]int32{}
		offset := int64(0)
		for {
			res, err := conn.Fetch(ctx, &kwire.FetchRequest{MaxWait: 10 * time.Millisecond, MaxBytes: 8 << 20,
				Partitions: []kwire.FetchPartition{{Topic: topic, Partition: int32(p), Offset: offset, LeaderEpoch: -1, MaxBytes: 8 << 20}}})
			if err != nil {
				t.Fatal(err)
			}
			if len(res) != 1 || res[0].Err != 0 {
				t.Fatalf("fetch %s/%d at %d: %+v", topic, p, offset, res)
			}
			bs, _, err := kwire.SplitBatches(res[0].Records)
			if err != nil {
				t.Fatal(err)
			}
			if len(bs) == 0 {
				if offset < res[0].HighWatermark {
					t.Fatalf("fetch %s/%d at %d returned no whole batch below the high watermark %d", topic, p, offset, res[0].HighWatermark)
				}
				break
			}
			for _, b := range bs {
				if b.LastOffset() < offset {
					continue
				}
				id := identity{b.ProducerID(), b.ProducerEpoch()}
				if want, ok := next[id]; ok && b.BaseSequence() != want {
					t.Fatalf("%s/%d offset %d: producer %d epoch %d batch has sequence %d, expected %d: a batch landed out of order (a late write by an owner that had lost the partition?)",
						topic, p, b.BaseOffset(), id.id, id.epoch, b.BaseSequence(), want)
				}
				next[id] = kwire.NextSequence(b.BaseSequence(), b.RecordCount())
				offset = b.LastOffset() + 1
				batches++
			}
		}
	}
	t.Logf("%s: %d destination batches, each producer's sequences contiguous", topic, batches)
}
