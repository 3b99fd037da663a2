package httpapi

import (
	"context"
	"embed"
	"fmt"
	"html/template"
	"maps"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
)

// The status page (issue 22, section 3): GET /ui, one server-rendered
// page (no script, no external resource) behind the API's auth. It shows
// mirrors, members, every partition with its lag in records and time and
// the progress of a catching-up partition, group sync rows, the latest
// state changes with their reasons, and per-topic lag charts of the last
// hour (api.LagHistorian, an in-memory ring on each member). It refreshes
// itself every uiRefresh.

//go:embed ui.html
var uiFiles embed.FS

var uiTemplate = template.Must(template.New("ui.html").Funcs(template.FuncMap{
	"timeLag": uiTimeLag,
	"pct":     func(f float64) string { return fmt.Sprintf("%.0f", f) },
	"join":    strings.Join,
}).ParseFS(uiFiles, "ui.html"))

// uiRefresh is how often the page reloads itself.
const uiRefresh = 10 * time.Second

// uiTimeout bounds the reads one page view makes.
const uiTimeout = 10 * time.Second

// uiPage is what ui.html renders.
type uiPage struct {
	Now        time.Time
	RefreshSec int
	Mirrors    []api.MirrorSummary
	Members    []api.MemberStatus
	Partitions []uiPartition
	Groups     []api.GroupStatus
	Changes    []uiPartition
	Charts     []uiChart
	// Errors name the reads that failed (the rest of the page shows).
	Errors []string
}

// uiPartition is a partition row with its progress (Progress < 0: none
// shown; a percentage of the source's offsets mirrored while behind).
type uiPartition struct {
	api.PartitionStatus
	Progress float64
	Since    time.Time
}

// uiChart is one topic's lag over the last hour: SVG polylines of the
// records not yet mirrored and of the time lag, each scaled to its
// maximum.
type uiChart struct {
	Topic                 string
	Points                int
	RecordsLine, TimeLine string
	MaxRecords            int64
	MaxTimeLagMs          int64
	FromAgo               string
}

// Chart size in SVG units.
const chartW, chartH = 600.0, 120.0

func (h *handler) ui(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), uiTimeout)
	defer cancel()
	page := uiPage{Now: time.Now().UTC(), RefreshSec: int(uiRefresh / time.Second)}
	fail := func(what string, err error) { page.Errors = append(page.Errors, what+": "+err.Error()) }
	var err error
	if page.Mirrors, err = h.api.ListMirrors(ctx); err != nil {
		fail("mirrors", err)
	}
	if page.Members, err = h.api.Members(ctx); err != nil {
		fail("members", err)
	}
	rows, err := h.api.Describe(ctx, "", "")
	if err != nil {
		fail("partitions", err)
	}
	for _, p := range rows {
		up := uiPartition{PartitionStatus: p, Progress: -1}
		if p.Lag > 0 && p.SourceOffset > 0 {
			up.Progress = math.Max(0, 100*float64(p.SourceOffset-p.Lag)/float64(p.SourceOffset))
		}
		if p.StateSinceMs > 0 {
			up.Since = time.UnixMilli(p.StateSinceMs).UTC()
		}
		page.Partitions = append(page.Partitions, up)
	}
	page.Changes = latestChanges(page.Partitions, 20)
	if page.Groups, err = h.api.DescribeGroups(ctx, ""); err != nil {
		fail("consumer groups", err)
	}
	if hist, ok := h.api.(api.LagHistorian); ok {
		page.Charts = lagCharts(hist.LagHistory(), page.Now)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:")
	if err := uiTemplate.Execute(w, page); err != nil {
		h.log.Warn("status page not rendered (the browser went away, or a template error)", zap.Error(err))
	}
}

// latestChanges are the n partitions whose state changed last (known
// times only), newest first.
func latestChanges(ps []uiPartition, n int) []uiPartition {
	var out []uiPartition
	for _, p := range ps {
		if !p.Since.IsZero() {
			out = append(out, p)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Since.After(out[j].Since) })
	return out[:min(n, len(out))]
}

// lagCharts draws each topic's lag over the samples (the last hour), x by
// time, y scaled to the topic's maximum (a flat line at the bottom when it
// was 0 throughout).
func lagCharts(samples []api.LagSample, now time.Time) []uiChart {
	if len(samples) == 0 {
		return nil
	}
	topics := map[string]bool{}
	for _, s := range samples {
		for t := range s.Topics {
			topics[t] = true
		}
	}
	from := samples[0].AtMs
	span := float64(max(now.UnixMilli()-from, 1))
	var out []uiChart
	for _, t := range slices.Sorted(maps.Keys(topics)) {
		c := uiChart{Topic: t, FromAgo: uiAgo(time.UnixMilli(from), now)}
		for _, s := range samples {
			c.MaxRecords = max(c.MaxRecords, s.Topics[t].Records)
			c.MaxTimeLagMs = max(c.MaxTimeLagMs, s.Topics[t].TimeLagMs)
		}
		var rec, tl []string
		for _, s := range samples {
			l, ok := s.Topics[t]
			if !ok {
				continue
			}
			x := chartW * float64(s.AtMs-from) / span
			rec = append(rec, fmt.Sprintf("%.1f,%.1f", x, chartY(l.Records, c.MaxRecords)))
			tl = append(tl, fmt.Sprintf("%.1f,%.1f", x, chartY(l.TimeLagMs, c.MaxTimeLagMs)))
		}
		c.Points, c.RecordsLine, c.TimeLine = len(rec), strings.Join(rec, " "), strings.Join(tl, " ")
		out = append(out, c)
	}
	return out
}

func chartY(v, top int64) float64 {
	if top <= 0 {
		return chartH - 1
	}
	return chartH - 1 - (chartH-2)*float64(v)/float64(top)
}

// uiTimeLag formats a time lag in ms ("-" not known).
func uiTimeLag(ms int64) string {
	switch {
	case ms < 0:
		return "-"
	case ms < 1000:
		return fmt.Sprintf("%dms", ms)
	}
	return (time.Duration(ms) * time.Millisecond).Round(100 * time.Millisecond).String()
}

// uiAgo says how long before now t was.
func uiAgo(t, now time.Time) string {
	return now.Sub(t).Round(time.Second).String() + " ago"
}
