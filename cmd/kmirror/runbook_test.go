package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestRunbooksNameREADMESections: every alert's runbook annotation in the
// shipped rules names README sections that exist (a heading of that
// title), so an operator paged at night lands on the text meant for them.
func TestRunbooksNameREADMESections(t *testing.T) {
	rules, err := os.ReadFile("../../deploy/prometheus/kmirror-rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]bool{}
	for _, line := range strings.Split(string(readme), "\n") {
		if h, ok := strings.CutPrefix(line, "#"); ok {
			headings[strings.TrimSpace(strings.TrimLeft(h, "#"))] = true
		}
	}
	parens := regexp.MustCompile(`\([^)]*\)`)
	n := 0
	for _, m := range regexp.MustCompile(`runbook: "README\.md, ([^"]*)"`).FindAllStringSubmatch(string(rules), -1) {
		n++
		// Sections named in a list ("A, B and C"); headings with an "and"
		// of their own ("Progress and lag") are read whole.
		names := parens.ReplaceAllString(m[1], "")
		for h := range headings {
			names = strings.ReplaceAll(names, h, strings.ReplaceAll(h, " and ", " & "))
		}
		for _, name := range regexp.MustCompile(`,| and `).Split(names, -1) {
			name = strings.TrimSpace(strings.ReplaceAll(name, "&", "and"))
			if name != "" && !isHeading(headings, name) {
				t.Errorf("runbook %q names README section %q, which has no heading", m[1], name)
			}
		}
	}
	if n < 15 {
		t.Fatalf("found %d runbook annotations in the rules, want one per alert", n)
	}
}

// isHeading reports whether a README heading starts with name ("Failback"
// names "Failback and adding a stopped topic again").
func isHeading(headings map[string]bool, name string) bool {
	for h := range headings {
		if name != "" && strings.HasPrefix(h, name) {
			return true
		}
	}
	return false
}
