package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/raftstore"
	"github.com/kmirror/kmirror/truncate"
)

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeMirrorTable prints the rows of `kmirror list`.
func writeMirrorTable(w io.Writer, mirrors []api.MirrorSummary) error {
	rows := [][]string{{"MIRROR", "TOPICS", "SOURCE-BOOTSTRAP", "STATE", "PATTERNS"}}
	for _, m := range mirrors {
		pats := "-"
		if len(m.Include)+len(m.Exclude) > 0 {
			pats = patternList(m.Include, m.Exclude)
			if n := len(m.Skipped); n > 0 {
				pats += fmt.Sprintf(" (%d matches skipped: see describe)", n)
			}
		}
		rows = append(rows, []string{m.Name, list(m.Topics), list(m.Bootstrap), m.State, pats})
	}
	if err := writeTable(w, rows); err != nil {
		return err
	}
	for _, m := range mirrors {
		for _, n := range m.Notes {
			if _, err := fmt.Fprintf(w, "%s: %s\n", m.Name, n); err != nil {
				return err
			}
		}
		runs := m.FailoverHooks[max(0, len(m.FailoverHooks)-shownHookRuns):]
		for _, r := range runs {
			if _, err := fmt.Fprintf(w, "%s: %s\n", m.Name, hookLine(r)); err != nil {
				return err
			}
		}
	}
	return nil
}

// shownHookRuns is how many of a mirror's latest failover hook runs
// kmirror list prints (--output json has every one kept).
const shownHookRuns = 5

// hookLine describes a failover hook run: "failover hook east-42 (remove
// of orders at 2026-12-05 18:00:01Z): succeeded after 2 attempts".
func hookLine(r api.HookRunStatus) string {
	at := "-"
	if r.StoppedAtMs > 0 {
		at = time.UnixMilli(r.StoppedAtMs).UTC().Format("2006-01-02 15:04:05Z")
	}
	line := fmt.Sprintf("failover hook %s (%s of %s at %s): %s", r.ID, r.Kind, strings.Join(r.Topics, ", "), at, r.State)
	switch r.State {
	case api.HookSucceeded:
		line += fmt.Sprintf(" after %d attempts", r.Attempts)
	case api.HookRetrying, api.HookFailed:
		line += fmt.Sprintf(" after %d attempts: %s", r.Attempts, r.LastError)
		for _, h := range r.Succeeded {
			line += fmt.Sprintf(" (failover.hook.%s succeeded)", h)
		}
	}
	return line
}

// writePartitionTable prints the rows of `kmirror describe`. The daemon
// fills the reason only when there is something to say: why a partition is
// not MIRRORING, or what a MIRRORING partition is retrying.
//
// LAG counts source records not mirrored yet, TIME-LAG is the replication
// latency (how long the oldest of them has been on the source), RECORDS/S
// the owner's rate over the last minute; a CATCHING UP table follows when
// some partition is behind (writeCatchingUp).
func writePartitionTable(w io.Writer, partitions []api.PartitionStatus) error {
	rows := [][]string{{"MIRROR", "TOPIC", "PARTITION", "SOURCE-OFFSET", "DESTINATION-OFFSET", "LAG", "TIME-LAG", "RECORDS/S", "OWNER", "STATE", "REASON"}}
	for _, p := range partitions {
		part, owner := partitionCells(p)
		rate := "-"
		if p.Partition >= 0 && p.SourceOffset >= 0 {
			rate = count(p.RecordsPerSec)
		}
		rows = append(rows, []string{
			p.Mirror, p.Topic, part,
			offset(p.SourceOffset), offset(p.DestinationOffset), offset(p.Lag), timeLag(p.TimeLagMs), rate,
			owner, p.State, p.Reason,
		})
	}
	if err := writeTable(w, rows); err != nil {
		return err
	}
	return writeCatchingUp(w, partitions)
}

// writeGroupTable prints the rows of `kmirror describe --groups`.
func writeGroupTable(w io.Writer, groups []api.GroupStatus) error {
	rows := [][]string{{"MIRROR", "GROUP", "KIND", "TOPIC", "PARTITION", "SOURCE-COMMITTED", "DESTINATION-COMMITTED", "STATE", "SYNC-LAG", "REASON"}}
	for _, g := range groups {
		lag := "-"
		if g.State != api.GroupSynced {
			lag = strconv.FormatFloat(float64(g.SyncLagMs)/1000, 'f', 1, 64) + "s"
		}
		kind := "consumer"
		if g.Kind != "" {
			kind = g.Kind
		}
		rows = append(rows, []string{g.Mirror, g.Group, kind, g.Topic, strconv.Itoa(int(g.Partition)),
			offset(g.SourceCommitted), offset(g.DestinationCommitted), g.State, lag, g.Reason})
	}
	return writeTable(w, rows)
}

// writePlans prints add --dry-run: per topic what add does, and per
// partition of a topic that continues, where and what diverged.
func writePlans(w io.Writer, plans []truncate.Plan) error {
	rows := [][]string{{"TOPIC", "PLAN", "PARTITION", "SOURCE-OFFSET", "DESTINATION-OFFSET", "DESTINATION-END", "DIVERGENT", "REASON"}}
	var notes []string
	for _, p := range plans {
		switch p.Kind {
		case truncate.KindNew:
			rows = append(rows, []string{p.Topic, "new: create and mirror from the start", "-", "-", "-", "-", "-", ""})
			continue
		case truncate.KindRefused:
			rows = append(rows, []string{p.Topic, "refused", "-", "-", "-", "-", "-", p.Reason})
			continue
		}
		what := p.Kind + " from mirror " + p.From + ": continue"
		if p.Divergent() {
			what = p.Kind + " from mirror " + p.From + ": refused without --truncate"
			notes = append(notes, fmt.Sprintf("--truncate would copy the %d divergent records of %s into %s.kmirror-diverged.N, delete %s "+
				"and mirror it again from the source", p.DivergentRecords(), p.Topic, p.Topic, p.Topic))
			if p.GroupsNote != "" {
				notes = append(notes, "--truncate is refused now: "+p.GroupsNote)
			}
			if len(p.Groups) > 0 {
				notes = append(notes, fmt.Sprintf("--truncate would give consumer groups their positions on %s back once the rebuilt topic is "+
					"mirrored past them: %s", p.Topic, groupPositions(p.Groups)))
			}
		}
		for _, pp := range p.Partitions {
			rows = append(rows, []string{p.Topic, what, strconv.Itoa(int(pp.Partition)), offset(pp.SourceOffset), offset(pp.DestinationOffset),
				offset(pp.DestinationEnd), strconv.FormatInt(pp.Divergent, 10), pp.Reason})
		}
	}
	if err := writeTable(w, rows); err != nil {
		return err
	}
	for _, n := range notes {
		if _, err := fmt.Fprintln(w, n); err != nil {
			return err
		}
	}
	return nil
}

// list joins values with commas, or "-" when there are none.
func list(values []string) string {
	if len(values) == 0 {
		return "-"
	}
	return strings.Join(values, ",")
}

// offset formats an offset or lag; negative means not known yet.
func offset(n int64) string {
	if n < 0 {
		return "-"
	}
	return strconv.FormatInt(n, 10)
}

// cellCleaner keeps server-supplied text from breaking the table layout.
var cellCleaner = strings.NewReplacer("\t", " ", "\n", " ", "\r", " ")

// writeTable aligns rows in columns two spaces apart, without trailing
// spaces.
func writeTable(w io.Writer, rows [][]string) error {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	for _, row := range rows {
		cells := make([]string, len(row))
		for i, cell := range row {
			cells[i] = cellCleaner.Replace(cell)
		}
		if _, err := io.WriteString(tw, strings.Join(cells, "\t")+"\n"); err != nil {
			return err
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var out strings.Builder
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		if line != "" {
			out.WriteString(strings.TrimRight(line, " \n") + "\n")
		}
	}
	_, err := io.WriteString(w, out.String())
	return err
}

// groupPositions names each group position a truncation keeps: "g
// partition 0 at 1000 (committed 1050)".
func groupPositions(pos []truncate.GroupPosition) string {
	parts := make([]string, 0, len(pos))
	for _, gp := range pos {
		s := fmt.Sprintf("%s partition %d at %d", gp.Group, gp.Partition, gp.Kept)
		switch {
		case gp.SourceOffset < 0:
			s = fmt.Sprintf("%s partition %d not given back (%s)", gp.Group, gp.Partition, gp.Reason)
		case gp.Kept != gp.Committed:
			s += fmt.Sprintf(" (committed %d, past the truncation point)", gp.Committed)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// notMirroring keeps the rows of partitions that are not MIRRORING.
func notMirroring(rows []api.PartitionStatus) []api.PartitionStatus {
	out := []api.PartitionStatus{}
	for _, r := range rows {
		if r.State != string(raftstore.StateMirroring) {
			out = append(out, r)
		}
	}
	return out
}

// writeFailedTable prints describe --failed: each partition not
// MIRRORING, since when (UTC, and how long before now) and how often it
// failed.
func writeFailedTable(w io.Writer, rows []api.PartitionStatus, now time.Time) error {
	table := [][]string{{"MIRROR", "TOPIC", "PARTITION", "STATE", "SINCE", "FAILURES", "OWNER", "REASON"}}
	for _, p := range rows {
		since := "-"
		if p.StateSinceMs > 0 {
			at := time.UnixMilli(p.StateSinceMs).UTC()
			since = at.Format("2006-01-02 15:04:05Z") + " (" + now.Sub(at).Round(time.Second).String() + " ago)"
		}
		part, owner := partitionCells(p)
		table = append(table, []string{p.Mirror, p.Topic, part, p.State, since, strconv.Itoa(p.Failures), owner, p.Reason})
	}
	return writeTable(w, table)
}

// partitionCells are a describe row's PARTITION and OWNER cells: "-" for a
// row of the whole topic (SKIPPED) and for no owner.
func partitionCells(p api.PartitionStatus) (part, owner string) {
	part, owner = strconv.Itoa(int(p.Partition)), p.Owner
	if p.Partition < 0 {
		part = "-"
	}
	if owner == "" {
		owner = "-"
	}
	return part, owner
}
