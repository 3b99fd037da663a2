package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kmirror/kmirror/daemon/api"
)

// watchFrame is one refresh of describe --watch --output json, a line of
// its own (JSON Lines): the time (RFC 3339, UTC) and the rows, or the
// error of a refresh that failed (the next one is tried anyway).
type watchFrame struct {
	Time       string                `json:"time"`
	Partitions []api.PartitionStatus `json:"partitions"`
	Error      string                `json:"error,omitempty"`
}

// watch runs describe every interval until the command's context ends
// (Ctrl-C), like top: on a terminal each refresh replaces the last, else
// refreshes follow each other. A refresh that fails is shown and the next
// one tried (a member restarting), except for a request that cannot
// succeed (an unknown mirror or topic, a bad token), which ends the watch.
func watch(c *cli.Context, interval time.Duration, load func() ([]api.PartitionStatus, error),
	render func(io.Writer, []api.PartitionStatus) error) error {
	w := c.App.Writer
	tty := isTerminal(w)
	for {
		rows, err := load()
		if errors.Is(err, api.ErrNotFound) || errors.Is(err, api.ErrInvalid) || errors.Is(err, api.ErrUnauthorized) {
			return err
		}
		now := time.Now().UTC()
		var buf bytes.Buffer
		if jsonOutput(c) {
			f := watchFrame{Time: now.Format(time.RFC3339), Partitions: rows}
			if err != nil {
				f.Error = err.Error()
			}
			if f.Partitions == nil {
				f.Partitions = []api.PartitionStatus{}
			}
			if err := json.NewEncoder(&buf).Encode(f); err != nil {
				return err
			}
		} else {
			if tty {
				buf.WriteString("\x1b[H\x1b[2J") // cursor home, clear the screen
			}
			fmt.Fprintf(&buf, "kmirror describe, every %s, at %s (Ctrl-C to stop)\n\n", interval, now.Format("2006-01-02 15:04:05Z"))
			if err != nil {
				fmt.Fprintf(&buf, "refresh failed, trying again: %v\n", err)
			} else if err := render(&buf, rows); err != nil {
				return err
			}
			if !tty {
				buf.WriteString("\n")
			}
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return err
		}
		select {
		case <-c.Context.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
