package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
	"github.com/kmirror/kmirror/integration/harness"
)

// Helpers of the group tests: a group of real kmirror members on shared
// clusters, what they own, and what their logs and the destination show.

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
	return startGroupEach(t, name, n, func(int) memberOpts { return base })
}

// startGroupEach is startGroupWith with member i's options (0-based) from
// opts(i).
func startGroupEach(t *testing.T, name string, n int, opts func(i int) memberOpts) *kgroup {
	t.Helper()
	return startGroupAdvertising(t, name, n, opts, nil)
}

// startGroupAdvertising is startGroupEach whose member i advertises the
// raft address advertise(i, listen) (a proxy in front of its listener);
// nil advertise: each its own listener.
func startGroupAdvertising(t *testing.T, name string, n int, opts func(i int) memberOpts, advertise func(i int, listen string) string) *kgroup {
	t.Helper()
	g := &kgroup{t: t}
	type addrs struct{ http, raft, advertised string }
	as := make([]addrs, n)
	for i := range as {
		as[i] = addrs{http: freeAddr(t), raft: freeAddr(t)}
		as[i].advertised = as[i].raft
		if advertise != nil {
			as[i].advertised = advertise(i, as[i].raft)
		}
		g.peers = append(g.peers, fmt.Sprintf("  - {id: %s-%d, raft: \"%s\", http: \"%s\"}\n", name, i+1, as[i].advertised, as[i].http))
	}
	for i := range n {
		o := opts(i)
		o.extra = "peers:\n" + strings.Join(g.peers, "") + groupLease + o.extra
		if as[i].advertised != as[i].raft {
			o.extra += fmt.Sprintf("raft_advertise: %q\n", as[i].advertised)
		}
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

// leadBy makes target the raft leader of g: while another member leads,
// that one is killed (SIGKILL) and started again, and the group elects
// anew; after six elections that missed, the test goes on with whoever
// leads, and says so.
func leadBy(t *testing.T, g *kgroup, target *member) {
	t.Helper()
	var other *member
	for _, m := range g.members {
		if m != target {
			other = m
			break
		}
	}
	for try := 0; try < 6; try++ {
		id := g.leaderID(other)
		if id == memberID(target) {
			return
		}
		l := g.byID(id)
		l.kill9()
		for end := time.Now().Add(30 * time.Second); !g.hasLeaderBut(target, id); time.Sleep(200 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("no leader elected within 30 s of killing %s", id)
			}
		}
		l.start()
	}
	t.Logf("%s does not lead after six elections; going on with %s as the leader", memberID(target), g.leaderID(other))
}

// hasLeaderBut reports whether m sees a raft leader other than id.
func (g *kgroup) hasLeaderBut(m *member, id string) bool {
	for _, r := range g.memberRows(m) {
		if r.Role == "leader" && r.ID != id {
			return true
		}
	}
	return false
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
			// Offsets unknown (-1): the owner's data path does not hold
			// the partition yet (the state says MIRRORING from the add
			// on; an owner still waiting for its first lease has not
			// started it, and a handoff of it then goes without a drain).
			if r.Owner == id || r.Owner == "" || r.State != "MIRRORING" || strings.HasPrefix(r.Reason, "resuming") || r.DestinationOffset < 0 {
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
