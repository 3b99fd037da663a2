package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/httpapi"
	"github.com/kmirror/kmirror/truncate"
)

// fakeAPI stands in for a member behind the real HTTP handler.
type fakeAPI struct {
	mu      sync.Mutex
	calls   []string
	err     error
	mirrors []api.MirrorSummary
	rows    []api.PartitionStatus
	members []api.MemberStatus
}

func (f *fakeAPI) record(format string, args ...any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
	return f.err
}

func (f *fakeAPI) CreateMirror(_ context.Context, req api.CreateMirrorRequest) error {
	return f.record("CreateMirror %s %v", req.Name, req.Properties)
}

func (f *fakeAPI) DeleteMirror(_ context.Context, name string, force bool) error {
	return f.record("DeleteMirror %s force=%t", name, force)
}

func (f *fakeAPI) AddTopics(_ context.Context, req api.AddTopicsRequest) (api.AddResult, error) {
	res := api.AddResult{Status: "added"}
	if req.Truncate {
		res.Truncated = []truncate.Result{{Quarantine: "orders.kmirror-diverged.1", Copied: []int64{3, 0}}}
	}
	if len(req.Include) > 0 {
		res.Topics = []api.AddedTopic{{Topic: "orders.eu", Result: api.TopicAdded},
			{Topic: "orders.us", Result: api.TopicNotAdded, Error: "matched, but mirrored by mirror west"}}
		res.Notes = []string{"pattern pay.* matches no source topic yet"}
		return res, f.record("AddTopics %s %v include=%v exclude=%v", req.Mirror, req.Topics, req.Include, req.Exclude)
	}
	return res, f.record("AddTopics %s %v from=%s rf=%d truncate=%t", req.Mirror, req.Topics, req.StartFrom, req.ReplicationFactor, req.Truncate)
}

func (f *fakeAPI) SetTopicPatterns(_ context.Context, req api.PatternsRequest) (api.AddResult, error) {
	return api.AddResult{Status: "altered"}, f.record("SetTopicPatterns %s include=%v exclude=%v remove=%t", req.Mirror, req.Include, req.Exclude, req.Remove)
}

func (f *fakeAPI) RemoveTopic(_ context.Context, mirror, topic string) error {
	return f.record("RemoveTopic %s %s", mirror, topic)
}

func (f *fakeAPI) ListMirrors(context.Context) ([]api.MirrorSummary, error) {
	return f.mirrors, f.record("ListMirrors")
}

func (f *fakeAPI) Describe(_ context.Context, mirror, topic string) ([]api.PartitionStatus, error) {
	return f.rows, f.record("Describe mirror=%s topic=%s", mirror, topic)
}

func (f *fakeAPI) Translate(_ context.Context, mirror, topic string, partition int32, offset int64) (api.Translation, error) {
	return api.Translation{Mirror: mirror, Topic: topic, Partition: partition, SourceOffset: offset, DestinationOffset: offset + 1}, nil
}

func (f *fakeAPI) Verify(_ context.Context, req api.VerifyRequest) ([]api.VerifyPartition, error) {
	rows := []api.VerifyPartition{{Partition: 0, From: 0, To: 40, Compared: 40, MismatchSource: -1, MismatchDestination: -1}}
	if req.Topic == "bad" {
		rows = append(rows, api.VerifyPartition{Partition: 1, From: 0, To: 30, Compared: 9, Mismatch: "source offset 9, destination offset 9: values differ",
			MismatchSource: 9, MismatchDestination: 9})
	}
	return rows, f.record("Verify %s %s full=%t samples=%d", req.Mirror, req.Topic, req.Full, req.Samples)
}

func (f *fakeAPI) Ready(context.Context) error { return nil }

func (f *fakeAPI) SwitchoverTopic(_ context.Context, mirror, topic string, timeout time.Duration) ([]string, error) {
	return nil, f.record("SwitchoverTopic %s %s %s", mirror, topic, timeout)
}

func (f *fakeAPI) PlanTopics(_ context.Context, req api.AddTopicsRequest) ([]truncate.Plan, error) {
	return []truncate.Plan{{Mirror: req.Mirror, Topic: "orders", Kind: truncate.KindFailback, From: "east-old",
			Partitions: []truncate.PartitionPlan{{Partition: 0, SourceOffset: 40, DestinationOffset: 50, DestinationEnd: 53, DivergentFrom: 50, Divergent: 3, Reason: "written after"}}}},
		f.record("PlanTopics %s %v", req.Mirror, req.Topics)
}

func (f *fakeAPI) PauseTopics(_ context.Context, mirror, topic string) ([]string, error) {
	return []string{"orders"}, f.record("PauseTopics %s %s", mirror, topic)
}

func (f *fakeAPI) UnpauseTopics(_ context.Context, mirror, topic string) ([]string, error) {
	return []string{"orders"}, f.record("UnpauseTopics %s %s", mirror, topic)
}

func (f *fakeAPI) AlterMirror(_ context.Context, req api.CreateMirrorRequest) error {
	return f.record("AlterMirror %s %v", req.Name, req.Properties)
}

func (f *fakeAPI) DescribeGroups(_ context.Context, mirror string) ([]api.GroupStatus, error) {
	return []api.GroupStatus{{Mirror: "a", Group: "billing", Topic: "t1", Partition: 2, SourceCommitted: 40, DestinationCommitted: 38,
		State: api.GroupConflict, Reason: "in use", SyncLagMs: 1500, Member: "m1"}}, f.record("DescribeGroups %s", mirror)
}

func (f *fakeAPI) Members(context.Context) ([]api.MemberStatus, error) {
	return f.members, f.record("Members")
}

func (f *fakeAPI) AddMember(_ context.Context, req api.AddMemberRequest) error {
	return f.record("AddMember %s raft=%s http=%s non-voter=%t", req.ID, req.RaftAddr, req.HTTPAddr, req.NonVoter)
}

func (f *fakeAPI) RemoveMember(_ context.Context, id string) error {
	return f.record("RemoveMember %s", id)
}

func (f *fakeAPI) DrainMember(_ context.Context, id string, drain bool) error {
	return f.record("DrainMember %s %t", id, drain)
}

func (f *fakeAPI) ResumePartitions(_ context.Context, req api.ResumeRequest) ([]int32, error) {
	return req.Partitions, f.record("ResumePartitions %s %s %v %t", req.Mirror, req.Topic, req.Partitions, req.AcceptGap)
}

type cliResult struct {
	code           int
	stdout, stderr string
	calls          []string
}

// runCLI runs kmirror with args against a fresh server backed by f.
func runCLI(t *testing.T, f *fakeAPI, args ...string) cliResult {
	t.Helper()
	srv := httptest.NewServer(httpapi.NewHandler(f, zap.NewNop(), nil))
	defer srv.Close()
	return runAt(f, srv.URL, args...)
}

func runAt(f *fakeAPI, url string, args ...string) cliResult {
	var stdout, stderr strings.Builder
	argv := append([]string{"kmirror", "--server", url}, args...)
	code := run(context.Background(), argv, &stdout, &stderr)
	f.mu.Lock()
	defer f.mu.Unlock()
	return cliResult{code, stdout.String(), stderr.String(), f.calls}
}

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCommandsSucceed(t *testing.T) {
	props := writeFile(t, "east.properties", "# source\nbootstrap.servers=a1:9092\nsecurity.protocol: SSL\n")
	tests := []struct {
		name   string
		args   []string
		stdout string
		call   string
	}{
		{"create", []string{"create", "--mirror", "east", "--mirror-config", props},
			"created mirror east\n", "CreateMirror east map[bootstrap.servers:a1:9092 security.protocol:SSL]"},
		{"add", []string{"add", "--mirror", "east", "--topic", "orders", "--topic", "payments,refunds", "--start-from", "latest", "--replication-factor", "3"},
			"added orders, payments, refunds to mirror east\n", "AddTopics east [orders payments refunds] from=latest rf=3 truncate=false"},
		{"add with defaults", []string{"add", "--mirror", "east", "--topic", "orders"},
			"added orders to mirror east\n", "AddTopics east [orders] from=earliest rf=0 truncate=false"},
		{"start (KIP-1279's verb for add)", []string{"start", "--mirror", "east", "--topic", "orders"},
			"added orders to mirror east\n", "AddTopics east [orders] from=earliest rf=0 truncate=false"},
		{"add truncate", []string{"add", "--mirror", "east", "--topic", "orders", "--truncate"},
			"added orders to mirror east\nquarantined 3 divergent records of orders into orders.kmirror-diverged.1; orders was deleted and is mirrored again from the source\n",
			"AddTopics east [orders] from=earliest rf=0 truncate=true"},
		{"add dry-run", []string{"add", "--mirror", "east", "--topic", "orders", "--dry-run"},
			"TOPIC   PLAN                                                       PARTITION  SOURCE-OFFSET  DESTINATION-OFFSET  DESTINATION-END  DIVERGENT  REASON\n" +
				"orders  failback from mirror east-old: refused without --truncate  0          40             50                  53               3          written after\n" +
				"--truncate would copy the 3 divergent records of orders into orders.kmirror-diverged.N, delete orders and mirror it again from the source\n",
			"PlanTopics east [orders]"},
		{"add include", []string{"add", "--mirror", "east", "--include", `orders\..*`, "--include", "pay.*", "--exclude", ".*-tmp"},
			`saved patterns --include orders\..* --include pay.* --exclude .*-tmp on mirror east: the leader adds new matching topics every topics.discovery.interval` + "\n" +
				"added orders.eu to mirror east\nskipped orders.us: matched, but mirrored by mirror west\nnote: pattern pay.* matches no source topic yet\n",
			`AddTopics east [] include=[orders\..* pay.*] exclude=[.*-tmp]`},
		{"remove include", []string{"remove", "--mirror", "east", "--include", "pay.*"},
			"removed patterns --include pay.* from mirror east; the topics they added stay mirrored (kmirror remove --topic stops one)\n",
			"SetTopicPatterns east include=[pay.*] exclude=[] remove=true"},
		{"alter include and exclude", []string{"alter", "--mirror", "east", "--include", "a.*", "--exclude", "a-tmp"},
			"mirror east now has patterns --include a.* --exclude a-tmp\nno new topic matched now\n",
			"SetTopicPatterns east include=[a.*] exclude=[a-tmp] remove=false"},
		{"remove", []string{"remove", "--mirror", "east", "--topic", "orders"},
			"removed orders from mirror east\n", "RemoveTopic east orders"},
		{"verify sampled", []string{"verify", "--mirror", "east", "--topic", "orders"},
			"PARTITION  SOURCE-OFFSETS  COMPARED  RESULT\n0          0..39           40        equal\n", "Verify east orders full=false samples=100"},
		{"verify full", []string{"verify", "--mirror", "east", "--topic", "orders", "--full"},
			"PARTITION  SOURCE-OFFSETS  COMPARED  RESULT\n0          0..39           40        equal\n", "Verify east orders full=true samples=100"},
		{"stop (KIP-1279's verb for remove)", []string{"stop", "--mirror", "east", "--topic", "orders"},
			"removed orders from mirror east\n", "RemoveTopic east orders"},
		{"remove wait-for-sync", []string{"remove", "--mirror", "east", "--topic", "orders", "--wait-for-sync"},
			"removed orders from mirror east\n", "SwitchoverTopic east orders 5m0s"},
		{"remove wait-for-sync timeout", []string{"remove", "--mirror", "east", "--topic", "orders", "--wait-for-sync=90s"},
			"removed orders from mirror east\n", "SwitchoverTopic east orders 1m30s"},
		{"pause", []string{"pause", "--mirror", "east", "--topic", "orders"},
			"paused orders (mirror east); see kmirror describe\n", "PauseTopics east orders"},
		{"pause mirror", []string{"pause", "--mirror", "east"}, "paused orders (mirror east); see kmirror describe\n", "PauseTopics east "},
		{"resume mirror", []string{"resume", "--mirror", "east"}, "resumed orders (mirror east); see kmirror describe\n", "UnpauseTopics east "},
		{"resume", []string{"resume", "--mirror", "east", "--topic", "orders", "--partition", "1,3", "--accept-gap"},
			"resumed partitions 1,3 of orders (mirror east); see kmirror describe\n", "ResumePartitions east orders [1 3] true"},
		{"delete", []string{"delete", "--mirror", "east", "--force"}, "deleted mirror east\n", "DeleteMirror east force=true"},
		{"list", []string{"list"},
			"MIRROR  TOPICS  SOURCE-BOOTSTRAP  STATE      PATTERNS\neast    orders  a1:9092           MIRRORING  -\n", "ListMirrors"},
		{"list json", []string{"--output", "json", "list"},
			"[\n  {\n    \"name\": \"east\",\n    \"topics\": [\n      \"orders\"\n    ],\n    \"bootstrap\": [\n      \"a1:9092\"\n    ],\n    \"state\": \"MIRRORING\"\n  }\n]\n",
			"ListMirrors"},
		{"describe", []string{"describe", "--mirror", "east", "--topic", "orders"},
			"MIRROR  TOPIC   PARTITION  SOURCE-OFFSET  DESTINATION-OFFSET  LAG  TIME-LAG  RECORDS/S  OWNER  STATE   REASON\n" +
				"east    orders  0          5              3                   2    -         0          -      FAILED  broker down\n",
			"Describe mirror=east topic=orders"},
		{"alter", []string{"alter", "--mirror", "east", "--mirror-config", props},
			"altered mirror east\n", "AlterMirror east map[bootstrap.servers:a1:9092 security.protocol:SSL]"},
		{"describe groups", []string{"describe", "--groups", "--mirror", "east"},
			"MIRROR  GROUP    KIND      TOPIC  PARTITION  SOURCE-COMMITTED  DESTINATION-COMMITTED  STATE     SYNC-LAG  REASON\n" +
				"a       billing  consumer  t1     2          40                38                     conflict  1.5s      in use\n",
			"DescribeGroups east"},
		{"create json", []string{"--output", "json", "create", "--mirror", "east", "--mirror-config", props},
			"{\n  \"result\": \"created\",\n  \"mirror\": \"east\"\n}\n", "CreateMirror east map[bootstrap.servers:a1:9092 security.protocol:SSL]"},
		{"members", []string{"members"},
			"ID  RAFT-ADDRESS  HTTP-ADDRESS  ROLE      PARTITIONS  LAST-CONTACT  LEASE-GRANTED  LEASE-TTL  STATE\n" +
				"m1  r1:7080       h1:8080       leader    4           -             -              10s        alive\n" +
				"m2  r2:7080       h2:8080       follower  0           12.3s ago     16.1s ago      -          unreachable\n" +
				"m2: dial tcp r2:7080: connect: connection refused\n", "Members"},
		{"members add, flags after the ID", []string{"members", "add", "m4", "--raft", "r4:7080", "--http=h4:8080", "--non-voter"},
			"added member m4\n", "AddMember m4 raft=r4:7080 http=h4:8080 non-voter=true"},
		{"members add, flags first", []string{"members", "add", "--raft", "r4:7080", "--http", "h4:8080", "m4"},
			"added member m4\n", "AddMember m4 raft=r4:7080 http=h4:8080 non-voter=false"},
		{"members drain", []string{"members", "drain", "m2"},
			"draining member m2: its partitions move to the others (see kmirror members)\n", "DrainMember m2 true"},
		{"members drain undo", []string{"members", "drain", "m2", "--undo"}, "member m2 takes partitions again\n", "DrainMember m2 false"},
		{"members remove", []string{"members", "remove", "m2"}, "removed member m2\n", "RemoveMember m2"},
		{"version", []string{"version"}, "kmirror dev (", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeAPI{
				mirrors: []api.MirrorSummary{{Name: "east", Topics: []string{"orders"}, Bootstrap: []string{"a1:9092"}, State: "MIRRORING"}},
				rows:    []api.PartitionStatus{{Mirror: "east", Topic: "orders", SourceOffset: 5, DestinationOffset: 3, Lag: 2, TimeLagMs: -1, State: "FAILED", Reason: "broker down"}},
				members: []api.MemberStatus{
					{ID: "m1", RaftAddr: "r1:7080", HTTPAddr: "h1:8080", Role: "leader", Partitions: 4, State: "alive", LeaseTTLMs: 10000},
					{ID: "m2", RaftAddr: "r2:7080", HTTPAddr: "h2:8080", Role: "follower", LastContactMs: 12345, LeaseGrantedMs: 16100, State: "unreachable",
						Error: "dial tcp r2:7080: connect: connection refused"},
				},
			}
			r := runCLI(t, f, tt.args...)
			if r.code != 0 || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
			if !strings.HasPrefix(r.stdout, tt.stdout) || (tt.name != "version" && r.stdout != tt.stdout) {
				t.Errorf("stdout\n%s\nwant\n%s", r.stdout, tt.stdout)
			}
			if tt.call == "" {
				if len(r.calls) != 0 {
					t.Errorf("calls %q, want none", r.calls)
				}
			} else if len(r.calls) != 1 || r.calls[0] != tt.call {
				t.Errorf("calls %q, want [%q]", r.calls, tt.call)
			}
		})
	}
}

func TestCommandsFail(t *testing.T) {
	malformed := writeFile(t, "bad.properties", "bootstrap.servers=a1:9092\n# ok\nthis line is wrong\n")
	noBootstrap := writeFile(t, "nobs.properties", "security.protocol=SSL\n")
	badConfig := writeFile(t, "kmirror.yaml", "node_id: m1\ndata_dir: /tmp/x\ndestination:\n  bootstrap_servers: [b:9092]\nlease_ttl: soon\n")
	notFound := fmt.Errorf("mirror %q: %w: create it first with kmirror create", "nope", api.ErrNotFound)

	tests := []struct {
		name   string
		apiErr error
		args   []string
		code   int
		stderr string // the one line, without "kmirror: " and "\n"
	}{
		{"unknown mirror", notFound, []string{"describe", "--mirror", "nope"}, 1,
			`mirror "nope": not found: create it first with kmirror create`},
		{"watch an unknown mirror", notFound, []string{"describe", "--watch", "--mirror", "nope"}, 1,
			`mirror "nope": not found: create it first with kmirror create`},
		{"interval without watch", nil, []string{"describe", "--interval", "5s"}, 2,
			"describe: --interval sets how often --watch refreshes; add --watch"},
		{"interval too short", nil, []string{"describe", "--watch", "--interval", "100ms"}, 2,
			"describe: --interval 100ms is too short: give 500ms or more"},
		{"watch groups", nil, []string{"describe", "--watch", "--groups"}, 2,
			"describe: --watch refreshes the partition view; leave out --groups"},
		{"unknown mirror on delete", notFound, []string{"delete", "--mirror", "nope"}, 1,
			`mirror "nope": not found: create it first with kmirror create`},
		{"missing properties file", nil, []string{"create", "--mirror", "east", "--mirror-config", noBootstrap + "x"}, 1,
			"mirror config: open " + noBootstrap + "x: no such file or directory"},
		{"malformed properties", nil, []string{"create", "--mirror", "east", "--mirror-config", malformed}, 1,
			malformed + `: line 3: is not key=value or key: value (the line is not shown: it may hold a secret; a multi-line value needs a backslash at the end of each line but the last)`},
		{"no bootstrap.servers", nil, []string{"create", "--mirror", "east", "--mirror-config", noBootstrap}, 1,
			noBootstrap + ": bootstrap.servers is required (host:port list of the source cluster)"},
		{"missing flags", nil, []string{"create"}, 2,
			"create: missing required flag --mirror, --mirror-config (run 'kmirror create --help')"},
		{"missing topic", nil, []string{"add", "--mirror", "east"}, 2,
			"add: missing required flag --topic or --include (run 'kmirror add --help')"},
		{"remove topic and pattern", nil, []string{"remove", "--mirror", "east", "--topic", "t", "--include", "t.*"}, 2,
			"remove: --topic and --include/--exclude do not go together: remove the patterns first, then the topics they added"},
		{"alter nothing", nil, []string{"alter", "--mirror", "east"}, 2,
			"alter: missing required flag --mirror-config (or --include/--exclude) (run 'kmirror alter --help')"},
		{"missing config", nil, []string{"daemon"}, 2,
			"daemon: missing required flag --config (run 'kmirror daemon --help')"},
		{"unknown flag", nil, []string{"remove", "--mirror", "east", "--topics", "t"}, 2,
			"remove: flag provided but not defined: -topics (run 'kmirror remove --help')"},
		{"bad flag value", nil, []string{"add", "--mirror", "east", "--topic", "t", "--replication-factor", "three"}, 2,
			`add: invalid value "three" for flag -replication-factor: parse error (run 'kmirror add --help')`},
		{"bad start-from", nil, []string{"add", "--mirror", "east", "--topic", "t", "--start-from", "middle"}, 2,
			`add: --start-from "middle": use earliest or latest`},
		{"bad replication factor", nil, []string{"add", "--mirror", "east", "--topic", "t", "--replication-factor", "0"}, 2,
			"add: --replication-factor 0: use -1 (destination default) or 1 to 32767"},
		{"wait-for-sync with a space", nil, []string{"remove", "--mirror", "east", "--topic", "t", "--wait-for-sync", "5s"}, 2,
			`remove: unexpected argument "5s": give the timeout with '=', as in --wait-for-sync=5s`},
		{"bad wait-for-sync", nil, []string{"remove", "--mirror", "east", "--topic", "t", "--wait-for-sync=abc"}, 2,
			"remove: --wait-for-sync takes a duration after '=', as in --wait-for-sync=10m (run 'kmirror remove --help')"},
		{"positional argument", nil, []string{"describe", "east"}, 2,
			`describe: unexpected argument "east": values go in flags (run 'kmirror describe --help')`},
		{"unknown command", nil, []string{"mirror"}, 2, `unknown command "mirror": run 'kmirror --help' for the list`},
		{"help for unknown command", nil, []string{"help", "mirror"}, 2, "No help topic for 'mirror'"},
		{"bad output", nil, []string{"--output", "yaml", "list"}, 2, `--output "yaml": use table or json`},
		{"invalid daemon config", nil, []string{"daemon", "--config", badConfig}, 2,
			"config " + badConfig + ": line 5: lease_ttl: cannot unmarshal !!str `soon` into time.Duration (want a duration such as 500ms, 1s or 2m)"},
		{"server error", fmt.Errorf("%w: raft leader unknown", api.ErrNotLeader), []string{"list"}, 1,
			"not the raft leader: raft leader unknown"},
		{"global option after the command", nil, []string{"describe", "--server", "http://h:1"}, 2,
			"describe: --server is a global option: put it before the command, as in kmirror --server ... describe"},
		{"members add without ID", nil, []string{"members", "add", "--raft", "r:1", "--http", "h:2"}, 2,
			"members add: give one ID (run 'kmirror members add --help')"},
		{"members add missing flag", nil, []string{"members", "add", "m4", "--raft", "r:1"}, 2,
			"members add: missing required flag --http (run 'kmirror members add --help')"},
		{"members add two IDs", nil, []string{"members", "add", "m4", "m5"}, 2,
			`members add: unexpected argument "m5": give one ID (run 'kmirror members add --help')`},
		{"members add unknown flag after ID", nil, []string{"members", "add", "m4", "--voter"}, 2,
			"members add: unknown flag --voter (run 'kmirror members add --help')"},
		{"members remove conflict", fmt.Errorf("%w: member m2 still holds 3 partitions: drain it first (kmirror members drain m2), then remove it", api.ErrConflict),
			[]string{"members", "remove", "m2"}, 1, "conflict: member m2 still holds 3 partitions: drain it first (kmirror members drain m2), then remove it"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runCLI(t, &fakeAPI{err: tt.apiErr}, tt.args...)
			if r.code != tt.code {
				t.Errorf("exit %d, want %d", r.code, tt.code)
			}
			if want := "kmirror: " + tt.stderr + "\n"; r.stderr != want {
				t.Errorf("stderr %q\nwant   %q", r.stderr, want)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
		})
	}
}

func TestServerNotRunning(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + l.Addr().String()
	l.Close()
	r := runAt(&fakeAPI{}, url, "list")
	want := "kmirror: cannot reach kmirror at " + url + ": is the daemon running? (set --server or KMIRROR_SERVER; several members may be listed, separated by commas)\n"
	if r.code != 1 || r.stderr != want {
		t.Errorf("exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestServerFromEnvironment(t *testing.T) {
	f := &fakeAPI{}
	srv := httptest.NewServer(httpapi.NewHandler(f, zap.NewNop(), nil))
	defer srv.Close()
	t.Setenv("KMIRROR_SERVER", srv.URL)
	var stdout, stderr strings.Builder
	if code := run(context.Background(), []string{"kmirror", "list"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if len(f.calls) != 1 {
		t.Errorf("server saw %q", f.calls)
	}
}

func TestBadServerURL(t *testing.T) {
	r := runAt(&fakeAPI{}, "127.0.0.1:8080", "list")
	if r.code != 2 || !strings.HasPrefix(r.stderr, "kmirror: --server: server URL \"127.0.0.1:8080\": want http://host:port") {
		t.Errorf("exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestHelp(t *testing.T) {
	r := runAt(&fakeAPI{}, "http://127.0.0.1:1", "add", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "--start-from") || r.stderr != "" {
		t.Errorf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestTokenNotSentInClear: a token is refused for an http:// server that
// is not on loopback, before anything is sent.
func TestTokenNotSentInClear(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for server, refused := range map[string]bool{
		"http://10.0.0.5:8080":                     true,
		"http://127.0.0.1:1,http://kmirror-2:8080": true,
		"http://127.0.0.1:1":                       false,
		"http://localhost:1":                       false,
		"https://10.0.0.5:8080":                    false,
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), []string{"kmirror", "--server", server, "--token-file", tok, "list"}, &out, &errb)
		got := strings.Contains(errb.String(), "would cross the network unencrypted")
		if got != refused {
			t.Errorf("--server %s: refused=%v (exit %d, %q), want %v", server, got, code, errb.String(), refused)
		}
	}
}

// TestVerifyMismatchExits1: kmirror verify prints its whole report and
// exits 1 when a partition differs, so a script can gate a switchover.
func TestVerifyMismatchExits1(t *testing.T) {
	res := runCLI(t, &fakeAPI{}, "verify", "--mirror", "east", "--topic", "bad")
	if res.code != exitError || !strings.Contains(res.stdout, "1          0..29           9         MISMATCH: source offset 9, destination offset 9: values differ") ||
		!strings.Contains(res.stderr, "the destination differs from the source") {
		t.Fatalf("verify of a topic with a mismatch: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if res := runCLI(t, &fakeAPI{}, "verify", "--mirror", "east", "--topic", "orders", "--full", "--samples", "5"); res.code != exitUsage {
		t.Fatalf("verify --full --samples: exit %d, want %d\n%s", res.code, exitUsage, res.stderr)
	}
}

// TestDescribeWatch: describe --watch refreshes until its context ends
// (Ctrl-C): as JSON, one line per refresh with the time and the rows; as
// a table, refreshes one after the other (not a terminal), each with the
// time; a refresh that fails is shown and the watch goes on.
func TestDescribeWatch(t *testing.T) {
	f := &fakeAPI{rows: []api.PartitionStatus{{Mirror: "east", Topic: "orders", SourceOffset: 5, DestinationOffset: 3, Lag: 2,
		TimeLagMs: 1500, RecordsPerSec: 10, EtaSeconds: 1, BytesLeft: 200, State: "MIRRORING"}}}
	srv := httptest.NewServer(httpapi.NewHandler(f, zap.NewNop(), nil))
	defer srv.Close()
	watchFor := func(frames int, frame string, args ...string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		out := &lockedBuilder{}
		done := make(chan int)
		go func() {
			done <- run(ctx, append([]string{"kmirror", "--server", srv.URL}, args...), out, io.Discard)
		}()
		deadline := time.Now().Add(10 * time.Second)
		for strings.Count(out.String(), frame) < frames && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		cancel()
		return out.String(), <-done
	}
	out, code := watchFor(2, "\n", "--output", "json", "describe", "--watch", "--interval", "500ms")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) < 2 {
		t.Fatalf("exit %d, output %q", code, out)
	}
	for _, l := range lines {
		var fr watchFrame
		if err := json.Unmarshal([]byte(l), &fr); err != nil || len(fr.Partitions) != 1 || fr.Partitions[0].TimeLagMs != 1500 || fr.Time == "" {
			t.Fatalf("line %q: %+v, %v", l, fr, err)
		}
	}
	f.mu.Lock()
	f.err = errors.New("connection refused") // a member restarting: shown, then tried again
	f.mu.Unlock()
	out, code = watchFor(2, "kmirror describe, every", "describe", "--watch", "--interval", "500ms")
	if code != 0 || strings.Count(out, "kmirror describe, every 500ms, at ") < 2 || !strings.Contains(out, "refresh failed, trying again: ") {
		t.Fatalf("exit %d, output\n%s", code, out)
	}
}

// lockedBuilder is a strings.Builder safe to read while written.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
