package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/kmirror/kmirror/daemon/api"
)

// Topic patterns (kmirror add/remove/alter --include and --exclude): Go
// regular expressions matched against whole topic names, saved on the
// mirror; the leader adds new matches every topics.discovery.interval.

func includeFlag(usage string) *cli.StringSliceFlag {
	return &cli.StringSliceFlag{Name: "include", Usage: usage}
}

func excludeFlag(usage string) *cli.StringSliceFlag {
	return &cli.StringSliceFlag{Name: "exclude", Usage: usage}
}

// checkRemove is remove's invocation check: --mirror, and --topic or
// patterns (not both).
func checkRemove(c *cli.Context) error {
	if err := checkInvocation(c, "mirror"); err != nil {
		return err
	}
	pats := c.IsSet("include") || c.IsSet("exclude")
	switch {
	case c.IsSet("topic") && pats:
		return usagef("remove: --topic and --include/--exclude do not go together: remove the patterns first, then the topics they added")
	case !c.IsSet("topic") && !pats:
		return usagef("remove: missing required flag --topic (or --include/--exclude) (run 'kmirror remove --help')")
	case pats && c.IsSet("wait-for-sync"):
		return usagef("remove: --wait-for-sync goes with --topic: removing a pattern stops no topic")
	}
	return nil
}

// checkAlter is alter's invocation check: --mirror, and --mirror-config or
// patterns.
func checkAlter(c *cli.Context) error {
	if err := checkInvocation(c, "mirror"); err != nil {
		return err
	}
	if !c.IsSet("mirror-config") && !c.IsSet("include") && !c.IsSet("exclude") {
		return usagef("alter: missing required flag --mirror-config (or --include/--exclude) (run 'kmirror alter --help')")
	}
	return nil
}

// removePatterns serves remove --include/--exclude.
func removePatterns(c *cli.Context, client *api.Client) error {
	req := api.PatternsRequest{Mirror: c.String("mirror"), Include: c.StringSlice("include"), Exclude: c.StringSlice("exclude"), Remove: true}
	if _, err := client.SetTopicPatterns(c.Context, req); err != nil {
		return err
	}
	return report(c, result{Result: "removed", Mirror: req.Mirror, Notes: []string{"the topics the patterns added stay mirrored"}},
		fmt.Sprintf("removed patterns %s from mirror %s; the topics they added stay mirrored (kmirror remove --topic stops one)",
			patternList(req.Include, req.Exclude), req.Mirror))
}

// alterPatterns serves alter --include/--exclude: the lists given replace
// the mirror's (a list not given is kept).
func alterPatterns(c *cli.Context, client *api.Client) error {
	mirror := c.String("mirror")
	req := api.PatternsRequest{Mirror: mirror, Include: c.StringSlice("include"), Exclude: c.StringSlice("exclude")}
	if !c.IsSet("include") || !c.IsSet("exclude") {
		mirrors, err := client.ListMirrors(c.Context)
		if err != nil {
			return err
		}
		for _, m := range mirrors {
			if m.Name == mirror && !c.IsSet("include") {
				req.Include = m.Include
			}
			if m.Name == mirror && !c.IsSet("exclude") {
				req.Exclude = m.Exclude
			}
		}
	}
	res, err := client.SetTopicPatterns(c.Context, req)
	if err != nil {
		return err
	}
	if jsonOutput(c) {
		return writeJSON(c.App.Writer, struct {
			result
			PerTopic []api.AddedTopic `json:"per_topic,omitempty"`
		}{result{Result: "altered", Mirror: mirror, Topics: addedTopics(nil, res.Topics), Notes: res.Notes}, res.Topics})
	}
	lines := []string{fmt.Sprintf("mirror %s now has patterns %s", mirror, patternList(req.Include, req.Exclude))}
	lines = append(lines, outcomeLines(mirror, res)...)
	_, err = fmt.Fprintln(c.App.Writer, strings.Join(lines, "\n"))
	return err
}

// writePatternAdd prints what add --include did.
func writePatternAdd(w io.Writer, req api.AddTopicsRequest, res api.AddResult) error {
	lines := []string{fmt.Sprintf("saved patterns %s on mirror %s: the leader adds new matching topics every topics.discovery.interval",
		patternList(req.Include, req.Exclude), req.Mirror)}
	lines = append(lines, outcomeLines(req.Mirror, res)...)
	_, err := fmt.Fprintln(w, strings.Join(lines, "\n"))
	return err
}

// outcomeLines says what became of the topics a pattern change matched.
func outcomeLines(mirror string, res api.AddResult) []string {
	var lines []string
	switch added := addedTopics(nil, res.Topics); {
	case len(added) > 0:
		lines = append(lines, fmt.Sprintf("added %s to mirror %s", strings.Join(added, ", "), mirror))
	case len(res.Topics) > 0:
		lines = append(lines, "no topic added now")
	default:
		lines = append(lines, "no new topic matched now")
	}
	for _, t := range res.Topics {
		switch t.Result {
		case api.TopicPending:
			lines = append(lines, fmt.Sprintf("pending %s: %s", t.Topic, t.Error))
		case api.TopicNotAdded:
			lines = append(lines, fmt.Sprintf("skipped %s: %s", t.Topic, t.Error))
		}
	}
	for _, n := range res.Notes {
		lines = append(lines, "note: "+n)
	}
	return lines
}

// addedTopics is named plus the topics of per that were added or left
// pending.
func addedTopics(named []string, per []api.AddedTopic) []string {
	if len(per) == 0 {
		return named
	}
	var out []string
	for _, t := range per {
		if t.Result != api.TopicNotAdded {
			out = append(out, t.Topic)
		}
	}
	return out
}

// patternList shows include and exclude patterns on one line.
func patternList(include, exclude []string) string {
	var parts []string
	for _, p := range include {
		parts = append(parts, "--include "+p)
	}
	for _, p := range exclude {
		parts = append(parts, "--exclude "+p)
	}
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, " ")
}
