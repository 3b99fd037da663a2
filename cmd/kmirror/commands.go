package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch/kafka/ksec"
	"github.com/kmirror/kmirror/truncate"
)

// result is the --output json reply of commands that change something.
type result struct {
	Result string   `json:"result"`
	Mirror string   `json:"mirror"`
	Topics []string `json:"topics,omitempty"`
	Notes  []string `json:"notes,omitempty"`
}

// report prints what a command changed: one line, or JSON.
func report(c *cli.Context, r result, line string) error {
	if jsonOutput(c) {
		return writeJSON(c.App.Writer, r)
	}
	_, err := fmt.Fprintln(c.App.Writer, line)
	return err
}

func mirrorFlag(usage string) *cli.StringFlag {
	return &cli.StringFlag{Name: "mirror", Usage: usage}
}

func createCommand() *cli.Command {
	return &cli.Command{
		Name:  "create",
		Usage: "define a mirror: a named connection to a source cluster",
		Flags: []cli.Flag{
			mirrorFlag("`NAME` of the new mirror (required)"),
			&cli.StringFlag{Name: "mirror-config", Usage: "Kafka .properties `FILE` with the source connection; must set bootstrap.servers (required)"},
		},
		Action: apiCall(required("mirror", "mirror-config"), func(c *cli.Context, client *api.Client) error {
			path := c.String("mirror-config")
			props, err := readProperties(path)
			if err != nil {
				return err
			}
			if strings.TrimSpace(props["bootstrap.servers"]) == "" {
				return fmt.Errorf("%s: bootstrap.servers is required (host:port list of the source cluster)", path)
			}
			name := c.String("mirror")
			if err := client.CreateMirror(c.Context, api.CreateMirrorRequest{Name: name, Properties: props}); err != nil {
				return err
			}
			return report(c, result{Result: "created", Mirror: name}, "created mirror "+name)
		}),
	}
}

func alterCommand() *cli.Command {
	return &cli.Command{
		Name:  "alter",
		Usage: "change a mirror's properties (group sync settings, bootstrap list of the same source cluster)",
		Flags: []cli.Flag{
			mirrorFlag("`NAME` of the mirror (required)"),
			&cli.StringFlag{Name: "mirror-config", Usage: "Kafka .properties `FILE` with all of the mirror's properties; it replaces the current ones (this, --include/--exclude, or both)"},
			includeFlag("replace the mirror's include patterns with these (`REGEX`, repeat); new matches are added at once"),
			excludeFlag("replace the mirror's exclude patterns with these (`REGEX`, repeat)"),
		},
		Action: apiCall(checkAlter, func(c *cli.Context, client *api.Client) error {
			if !c.IsSet("mirror-config") {
				return alterPatterns(c, client)
			}
			props, err := readProperties(c.String("mirror-config"))
			if err != nil {
				return err
			}
			name := c.String("mirror")
			if err := client.AlterMirror(c.Context, api.CreateMirrorRequest{Name: name, Properties: props}); err != nil {
				return err
			}
			if c.IsSet("include") || c.IsSet("exclude") {
				return alterPatterns(c, client)
			}
			return report(c, result{Result: "altered", Mirror: name}, "altered mirror "+name)
		}),
	}
}

func readProperties(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("mirror config: %w", err)
	}
	defer f.Close()
	props, err := ksec.ParseProperties(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return props, nil
}

func addCommand() *cli.Command {
	return &cli.Command{
		Name:    "add",
		Aliases: []string{"start"},
		Usage:   "start mirroring topics of a mirror into the destination cluster",
		Flags: []cli.Flag{
			mirrorFlag("`NAME` of the mirror (required)"),
			&cli.StringSliceFlag{Name: "topic", Usage: "`TOPIC` to mirror; repeat or separate with commas (this, --include, or both)"},
			includeFlag("save `REGEX` on the mirror: every source topic whose whole name it matches is mirrored, now and when created " +
				"later (within topics.discovery.interval, default 30s); internal topics (__*) never match; repeat for more"),
			excludeFlag("save `REGEX` on the mirror: topics whose whole name it matches are left out of --include's matches; repeat for more"),
			&cli.StringFlag{Name: "start-from", Usage: "`POSITION` where new topics start: earliest or latest", Value: "earliest"},
			&cli.IntFlag{Name: "replication-factor", Usage: "`N` replicas per destination topic partition; -1 = the destination broker's default",
				DefaultText: "the daemon's destination.replication_factor"},
			&cli.BoolFlag{Name: "dry-run", Usage: "print what adding each topic would do (new, or continued from its last mirrored position, " +
				"with any divergent records) and change nothing"},
			&cli.BoolFlag{Name: "truncate", Usage: "where the existing destination topic has records past the last mirrored position, " +
				"copy them into TOPIC.kmirror-diverged.N, delete the topic and mirror it again from the source"},
		},
		Action: apiCall(checkAdd, func(c *cli.Context, client *api.Client) error {
			req := api.AddTopicsRequest{
				Mirror:            c.String("mirror"),
				Topics:            c.StringSlice("topic"),
				StartFrom:         c.String("start-from"),
				ReplicationFactor: int16(c.Int("replication-factor")), // 0 when unset: the daemon's configured value
				Include:           c.StringSlice("include"),
				Exclude:           c.StringSlice("exclude"),
			}
			if c.Bool("dry-run") {
				if c.Bool("truncate") {
					return usagef("add: --dry-run and --truncate do not go together: the dry run shows what --truncate would do")
				}
				plans, err := client.PlanTopics(c.Context, req)
				if err != nil {
					return err
				}
				if jsonOutput(c) {
					return writeJSON(c.App.Writer, plans)
				}
				return writePlans(c.App.Writer, plans)
			}
			req.Truncate = c.Bool("truncate")
			res, err := client.AddTopics(c.Context, req)
			if err != nil {
				return err
			}
			if jsonOutput(c) {
				return writeJSON(c.App.Writer, struct {
					result
					Truncated []truncate.Result `json:"truncated,omitempty"`
					PerTopic  []api.AddedTopic  `json:"per_topic,omitempty"`
				}{result{Result: "added", Mirror: req.Mirror, Topics: addedTopics(req.Topics, res.Topics), Notes: res.Notes}, res.Truncated, res.Topics})
			}
			if len(req.Include) > 0 || len(req.Exclude) > 0 {
				return writePatternAdd(c.App.Writer, req, res)
			}
			added := req.Topics
			var pending []string
			if len(res.Topics) > 0 {
				added = nil
				for _, t := range res.Topics {
					if t.Result == api.TopicPending {
						pending = append(pending, fmt.Sprintf("pending %s: %s", t.Topic, t.Error))
					} else {
						added = append(added, t.Topic)
					}
				}
			}
			var lines []string
			if len(added) > 0 {
				lines = append(lines, fmt.Sprintf("added %s to mirror %s", strings.Join(added, ", "), req.Mirror))
			}
			lines = append(lines, pending...)
			for _, tr := range res.Truncated {
				var n int64
				for _, c := range tr.Copied {
					n += c
				}
				topic := strings.TrimSuffix(tr.Quarantine[:strings.LastIndex(tr.Quarantine, ".")], ".kmirror-diverged")
				lines = append(lines, fmt.Sprintf("quarantined %d divergent records of %s into %s; %s was deleted and is mirrored again from the source",
					n, topic, tr.Quarantine, topic))
				if len(tr.Groups) > 0 {
					lines = append(lines, fmt.Sprintf("consumer group positions on %s kept and given back once the rebuilt topic is mirrored "+
						"past them (kmirror describe --groups shows each until it is committed): %s", topic, groupPositions(tr.Groups)))
				}
			}
			_, err = fmt.Fprintln(c.App.Writer, strings.Join(lines, "\n"))
			return err
		}),
	}
}

// checkAdd is add's invocation check: --mirror and --topic, and the
// values of --start-from and --replication-factor.
func checkAdd(c *cli.Context) error {
	if err := checkInvocation(c, "mirror"); err != nil {
		return err
	}
	if !c.IsSet("topic") && !c.IsSet("include") && !c.IsSet("exclude") {
		return usagef("add: missing required flag --topic or --include (run 'kmirror add --help')")
	}
	if startFrom := c.String("start-from"); startFrom != "earliest" && startFrom != "latest" {
		return usagef("add: --start-from %q: use earliest or latest", startFrom)
	}
	if rf := c.Int("replication-factor"); c.IsSet("replication-factor") && rf != -1 && (rf < 1 || rf > 32767) {
		return usagef("add: --replication-factor %d: use -1 (destination default) or 1 to 32767", rf)
	}
	return nil
}

func removeCommand() *cli.Command {
	return &cli.Command{
		Name:    "remove",
		Aliases: []string{"stop"},
		Usage:   "stop mirroring a topic and record its last mirrored position (failover); the destination topic is then the one to use",
		Flags: []cli.Flag{
			mirrorFlag("`NAME` of the mirror (required)"),
			&cli.StringFlag{Name: "topic", Usage: "`TOPIC` to stop mirroring (this, or --include/--exclude)"},
			includeFlag("take the include pattern `REGEX` off the mirror: no new topics are added for it; the topics it added stay mirrored"),
			excludeFlag("take the exclude pattern `REGEX` off the mirror: the topics it left out are added at the next discovery"),
			&cli.GenericFlag{Name: "wait-for-sync", Value: &waitForSync{},
				Usage: "planned switchover: keep mirroring until the topic has no lag against the source's last stable offset (producers " +
					"stopped) and its groups are synced, then stop; fail, stopping nothing, if that takes longer than the timeout: " +
					"--wait-for-sync=10m (with '='; alone: 5m). Without it: emergency failover, at once"},
		},
		Action: apiCall(checkRemove, func(c *cli.Context, client *api.Client) error {
			if !c.IsSet("topic") {
				return removePatterns(c, client)
			}
			mirror, topic := c.String("mirror"), c.String("topic")
			var err error
			var notes []string
			if w := c.Generic("wait-for-sync").(*waitForSync); w.timeout > 0 {
				notes, err = client.SwitchoverTopic(c.Context, mirror, topic, w.timeout)
			} else {
				err = client.RemoveTopic(c.Context, mirror, topic)
			}
			if err != nil {
				return err
			}
			line := fmt.Sprintf("removed %s from mirror %s", topic, mirror)
			for _, n := range notes {
				line += "\nnote: " + n
			}
			return report(c, result{Result: "removed", Mirror: mirror, Topics: []string{topic}, Notes: notes}, line)
		}),
	}
}

// waitForSync is remove's --wait-for-sync[=TIMEOUT]: a flag with an
// optional value (IsBoolFlag lets the flag package accept it bare).
type waitForSync struct{ timeout time.Duration }

// defaultSwitchoverTimeout is --wait-for-sync without a value.
const defaultSwitchoverTimeout = 5 * time.Minute

func (w *waitForSync) IsBoolFlag() bool { return true }

func (w *waitForSync) String() string {
	if w == nil || w.timeout == 0 {
		return ""
	}
	return w.timeout.String()
}

func (w *waitForSync) Set(s string) error {
	switch s {
	case "true":
		w.timeout = defaultSwitchoverTimeout
	case "false":
		w.timeout = 0
	default:
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return fmt.Errorf("%q is not a positive duration such as 10m", s)
		}
		w.timeout = d
	}
	return nil
}

func resumeCommand() *cli.Command {
	return &cli.Command{
		Name:  "resume",
		Usage: "resume PAUSED topics, or restart DIVERGED or FAILED partitions of a topic once the cause is dealt with (they are verified again)",
		Flags: []cli.Flag{
			mirrorFlag("`NAME` of the mirror (required)"),
			&cli.StringFlag{Name: "topic", Usage: "`TOPIC` to resume (default: every PAUSED topic of the mirror)"},
			&cli.IntSliceFlag{Name: "partition", Usage: "`N` to resume; repeat or separate with commas (default: every DIVERGED or FAILED partition)"},
			&cli.BoolFlag{Name: "accept-gap", Usage: "skip source records deleted before they were mirrored, once; they are counted as lost in describe and /metrics"},
		},
		Action: apiCall(required("mirror"), func(c *cli.Context, client *api.Client) error {
			if !c.IsSet("topic") {
				if c.IsSet("partition") || c.Bool("accept-gap") {
					return usagef("resume: --partition and --accept-gap need --topic")
				}
				return pauseAction(c, client.UnpauseTopics, "resumed")
			}
			req := api.ResumeRequest{Mirror: c.String("mirror"), Topic: c.String("topic"), AcceptGap: c.Bool("accept-gap")}
			for _, p := range c.IntSlice("partition") {
				if p < 0 || p > math.MaxInt32 {
					return usagef("resume: --partition %d is not a partition number", p)
				}
				req.Partitions = append(req.Partitions, int32(p))
			}
			resumed, err := client.ResumePartitions(c.Context, req)
			if err != nil {
				return err
			}
			parts := make([]string, len(resumed))
			for i, p := range resumed {
				parts[i] = strconv.Itoa(int(p))
			}
			if jsonOutput(c) {
				return writeJSON(c.App.Writer, struct {
					Result     string  `json:"result"`
					Mirror     string  `json:"mirror"`
					Topic      string  `json:"topic"`
					Partitions []int32 `json:"partitions"`
				}{"resumed", req.Mirror, req.Topic, resumed})
			}
			if len(resumed) == 0 {
				_, err = fmt.Fprintf(c.App.Writer, "nothing to resume: %s (mirror %s) has no PAUSED, DIVERGED or FAILED partition\n", req.Topic, req.Mirror)
				return err
			}
			_, err = fmt.Fprintf(c.App.Writer, "resumed partitions %s of %s (mirror %s); see kmirror describe\n", strings.Join(parts, ","), req.Topic, req.Mirror)
			return err
		}),
	}
}

func pauseCommand() *cli.Command {
	return &cli.Command{
		Name:  "pause",
		Usage: "pause mirroring a topic, or every topic of a mirror: nothing is fetched; kmirror resume continues exactly",
		Flags: []cli.Flag{
			mirrorFlag("`NAME` of the mirror (required)"),
			&cli.StringFlag{Name: "topic", Usage: "`TOPIC` to pause (default: every MIRRORING topic of the mirror)"},
		},
		Action: apiCall(required("mirror"), func(c *cli.Context, client *api.Client) error {
			return pauseAction(c, client.PauseTopics, "paused")
		}),
	}
}

// pauseAction pauses or resumes the --topic of the --mirror (all for
// none) with call and reports the topics changed.
func pauseAction(c *cli.Context, call func(ctx context.Context, mirror, topic string) ([]string, error), done string) error {
	mirror := c.String("mirror")
	topics, err := call(c.Context, mirror, c.String("topic"))
	if err != nil {
		return err
	}
	line := fmt.Sprintf("%s %s (mirror %s); see kmirror describe", done, strings.Join(topics, ", "), mirror)
	if len(topics) == 0 {
		line = fmt.Sprintf("mirror %s has no topic left to change: nothing %s", mirror, done)
	}
	return report(c, result{Result: done, Mirror: mirror, Topics: topics}, line)
}

func listCommand() *cli.Command {
	return &cli.Command{
		Name:  "list",
		Usage: "list mirrors with their topics and state",
		Action: apiCall(required(), func(c *cli.Context, client *api.Client) error {
			mirrors, err := client.ListMirrors(c.Context)
			if err != nil {
				return err
			}
			if jsonOutput(c) {
				return writeJSON(c.App.Writer, mirrors)
			}
			return writeMirrorTable(c.App.Writer, mirrors)
		}),
	}
}

func describeCommand() *cli.Command {
	return &cli.Command{
		Name:  "describe",
		Usage: "show offsets, lag and state per mirrored partition (with --groups: the consumer group offset sync)",
		Flags: []cli.Flag{
			mirrorFlag("only this mirror `NAME`"),
			&cli.StringFlag{Name: "topic", Usage: "only this `TOPIC`"},
			&cli.BoolFlag{Name: "groups", Usage: "show each synced consumer group's committed offsets on both clusters instead"},
			&cli.BoolFlag{Name: "failed", Usage: "show only the partitions that are not MIRRORING, with since when and how often they failed (KIP-1279's view)"},
			&cli.BoolFlag{Name: "watch", Usage: "refresh every --interval until Ctrl-C, in place on a terminal; with --output json one JSON line per refresh"},
			&cli.DurationFlag{Name: "interval", Value: 2 * time.Second, Usage: "`DURATION` between refreshes of --watch (at least 500ms)"},
		},
		Action: apiCall(required(), func(c *cli.Context, client *api.Client) error {
			if c.Bool("groups") {
				if c.Bool("failed") {
					return usagef("describe: --failed shows partitions; leave out --groups")
				}
				if c.IsSet("topic") {
					return usagef("describe: --groups shows every topic of the mirror; leave out --topic")
				}
				if c.Bool("watch") {
					return usagef("describe: --watch refreshes the partition view; leave out --groups")
				}
				rows, err := client.DescribeGroups(c.Context, c.String("mirror"))
				if err != nil {
					return err
				}
				if jsonOutput(c) {
					return writeJSON(c.App.Writer, rows)
				}
				return writeGroupTable(c.App.Writer, rows)
			}
			load := func() ([]api.PartitionStatus, error) {
				rows, err := client.Describe(c.Context, c.String("mirror"), c.String("topic"))
				if err == nil && c.Bool("failed") {
					rows = notMirroring(rows)
				}
				return rows, err
			}
			render := writePartitionTable
			if c.Bool("failed") {
				render = func(w io.Writer, rows []api.PartitionStatus) error { return writeFailedTable(w, rows, time.Now()) }
			}
			if c.Bool("watch") {
				if c.Duration("interval") < 500*time.Millisecond {
					return usagef("describe: --interval %s is too short: give 500ms or more", c.Duration("interval"))
				}
				return watch(c, c.Duration("interval"), load, render)
			}
			if c.IsSet("interval") {
				return usagef("describe: --interval sets how often --watch refreshes; add --watch")
			}
			rows, err := load()
			if err != nil {
				return err
			}
			if jsonOutput(c) {
				return writeJSON(c.App.Writer, rows)
			}
			return render(c.App.Writer, rows)
		}),
	}
}

func deleteCommand() *cli.Command {
	return &cli.Command{
		Name:  "delete",
		Usage: "delete a mirror",
		Flags: []cli.Flag{
			mirrorFlag("`NAME` of the mirror (required)"),
			&cli.BoolFlag{Name: "force", Usage: "delete even while the mirror still has topics"},
		},
		Action: apiCall(required("mirror"), func(c *cli.Context, client *api.Client) error {
			name := c.String("mirror")
			if err := client.DeleteMirror(c.Context, name, c.Bool("force")); err != nil {
				return err
			}
			return report(c, result{Result: "deleted", Mirror: name}, "deleted mirror "+name)
		}),
	}
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version of this binary",
		Action: func(c *cli.Context) error {
			if err := checkInvocation(c); err != nil {
				return err
			}
			if jsonOutput(c) {
				return writeJSON(c.App.Writer, map[string]string{"version": version, "go": runtime.Version()})
			}
			_, err := fmt.Fprintf(c.App.Writer, "kmirror %s (%s)\n", version, runtime.Version())
			return err
		},
	}
}
