package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// What the demo shows and checks: the CLI, describe, catching up, and the
// record-by-record comparison of both clusters.

// cli runs the kmirror CLI against the daemon, echoing the command line
// and its output, and returns the output.
func (d *demo) cli(ctx context.Context, args ...string) (string, error) {
	fmt.Printf("$ kmirror %s\n", strings.Join(args, " "))
	out, err := exec.CommandContext(ctx, d.bin, append([]string{"--server", d.servers}, args...)...).CombinedOutput()
	fmt.Print(string(out))
	if err != nil {
		return "", fmt.Errorf("kmirror %s: %w", args[0], err)
	}
	return string(out), nil
}

// describe prints `kmirror describe`, returns its rows and reports whether
// every partition of the demo topic is MIRRORING with LAG 0. A DIVERGED
// partition is an error: it needs an operator.
func (d *demo) describe(ctx context.Context) (rows []map[string]string, caughtUp bool, err error) {
	// The demo topic's partitions only: a topic the reader adds to the
	// mirror while the demo runs is theirs to watch.
	out, err := d.cli(ctx, "describe", "--mirror", mirror, "--topic", topic)
	if err != nil {
		return nil, false, err
	}
	rows = parseTable(out)
	caughtUp = len(rows) == partitions
	for _, r := range rows {
		if r["STATE"] == "DIVERGED" {
			return nil, false, fmt.Errorf("partition %s/%s is DIVERGED: %s", r["TOPIC"], r["PARTITION"], r["REASON"])
		}
		if r["STATE"] != "MIRRORING" || r["LAG"] != "0" || r["SOURCE-OFFSET"] != r["DESTINATION-OFFSET"] {
			caughtUp = false
		}
	}
	return rows, caughtUp, nil
}

// parseTable turns the describe table into one map per row, keyed by the
// header. REASON, the last column, may hold spaces.
func parseTable(out string) []map[string]string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	header := strings.Fields(lines[0])
	var rows []map[string]string
	for _, line := range lines[1:] {
		fields := strings.Fields(line)
		row := map[string]string{}
		for i, name := range header {
			switch {
			case i >= len(fields):
			case i == len(header)-1:
				row[name] = strings.Join(fields[i:], " ")
			default:
				row[name] = fields[i]
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// waitCaughtUp describes every 2 s until every partition shows LAG 0 and
// returns the last rows.
func (d *demo) waitCaughtUp(ctx context.Context, timeout time.Duration) ([]map[string]string, error) {
	deadline := time.After(timeout)
	for {
		rows, caughtUp, err := d.describe(ctx)
		if err != nil || caughtUp {
			return rows, err
		}
		select {
		case who := <-d.died:
			return nil, fmt.Errorf("kmirror member %s exited", who)
		case <-deadline:
			return nil, fmt.Errorf("the mirror did not catch up within %s", timeout)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// live produces a few records per second and describes every 5 s until
// duration has passed or ctx is cancelled (Ctrl-C), which both end the demo
// normally.
func (d *demo) live(ctx context.Context, duration time.Duration) error {
	end := time.After(duration)
	produceTick := time.NewTicker(time.Second)
	defer produceTick.Stop()
	describeTick := time.NewTicker(5 * time.Second)
	defer describeTick.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Println()
			say("interrupted")
			return nil
		case <-end:
			return nil
		case who := <-d.died:
			return fmt.Errorf("kmirror member %s exited", who)
		case <-produceTick.C:
			if err := d.produce(ctx, perSecond); err != nil && ctx.Err() == nil {
				return err
			}
		case <-describeTick.C:
			fmt.Printf("   %d records produced so far\n", d.produced)
			if _, _, err := d.describe(ctx); err != nil && ctx.Err() == nil {
				return err
			}
		}
	}
}

// checkExactlyOnce reads every destination partition and requires each
// order produced to be there once, with every key's orders in the order
// they were produced.
func (d *demo) checkExactlyOnce(ctx context.Context) error {
	seen := make([]int, d.produced)
	for p := 0; p < partitions; p++ {
		conn, err := kafka.DialLeader(ctx, "tcp", d.dst.BrokerAddrs()[0], topic, p)
		if err != nil {
			return fmt.Errorf("reading destination partition %d: %w", p, err)
		}
		last := map[string]int{}
		end, err := conn.ReadLastOffset()
		for off := int64(0); err == nil && off < end; {
			if err = conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
				break
			}
			batch := conn.ReadBatch(1, 10<<20)
			for {
				msg, rerr := batch.ReadMessage()
				if rerr != nil {
					break
				}
				off = msg.Offset + 1
				var id int
				if _, serr := fmt.Sscanf(string(msg.Value), `{"order_id":%d,`, &id); serr != nil || id < 0 || id >= d.produced {
					conn.Close()
					return fmt.Errorf("destination partition %d offset %d holds an unexpected value %q", p, msg.Offset, msg.Value)
				}
				seen[id]++
				if prev, ok := last[string(msg.Key)]; ok && prev > id {
					conn.Close()
					return fmt.Errorf("destination partition %d: order %d of %s after order %d", p, id, msg.Key, prev)
				}
				last[string(msg.Key)] = id
			}
			err = batch.Close()
		}
		conn.Close()
		if err != nil {
			return fmt.Errorf("reading destination partition %d: %w", p, err)
		}
	}
	for id, n := range seen {
		if n != 1 {
			return fmt.Errorf("order %d is on the destination %d times, want exactly once", id, n)
		}
	}
	return nil
}
