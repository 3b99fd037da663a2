package harness

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

const pollInterval = 200 * time.Millisecond

// waitReady polls until every running broker answers Metadata listing all
// running brokers, for at most 90 s (or until ctx ends). A node whose JVM
// exits fails the wait at once. Errors carry the nodes' last log lines.
func (c *Cluster) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	return c.poll(ctx, "to list all running brokers", func(ctx context.Context) error {
		var want []int
		var addrs []string
		for _, n := range c.brokers {
			if c.running(n) != nil {
				want = append(want, n.id)
				addrs = append(addrs, n.addr())
			}
		}
		for _, addr := range addrs {
			md, err := metadata(ctx, addr)
			if err != nil {
				return err
			}
			c.mu.Lock()
			if c.zk && c.clusterID == "" && md.ClusterID != "" {
				c.clusterID = md.ClusterID // created by the first broker
			}
			wantID := c.clusterID
			c.mu.Unlock()
			if md.ClusterID != wantID {
				// Another process took this port while the node was down.
				return fmt.Errorf("%s answers for cluster %s, not %s", addr, md.ClusterID, wantID)
			}
			var got []int
			for _, b := range md.Brokers {
				got = append(got, b.ID)
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				return fmt.Errorf("broker at %s lists node ids %v, want %v", addr, got, want)
			}
		}
		return nil
	})
}

// poll calls check until it succeeds, ctx ends or a node's JVM exits.
func (c *Cluster) poll(ctx context.Context, what string, check func(context.Context) error) error {
	start := time.Now()
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	for {
		if n, p := c.exited(); n != nil {
			return fmt.Errorf("harness: %s exited (%v) while waiting for cluster %s %s%s", n.label, p.err, c.name, what, c.tails())
		}
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := check(attempt)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("harness: cluster %s not ready %s after %s: %w (%w)%s",
				c.name, what, time.Since(start).Round(time.Millisecond), ctx.Err(), err, c.tails())
		case <-ticker.C:
		}
	}
}

// exited returns a node whose JVM has exited without being stopped.
func (c *Cluster) exited() (*node, *process) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes() {
		if n.proc == nil {
			continue
		}
		select {
		case <-n.proc.done:
			return n, n.proc
		default:
		}
	}
	return nil, nil
}

// tails formats the last log lines of every node for an error message.
func (c *Cluster) tails() string {
	var b strings.Builder
	for _, n := range c.nodes() {
		if lines := n.out.lines(); lines != "" {
			fmt.Fprintf(&b, "\n--- last lines of %s (log level %s) ---\n%s", n.label, logLevel(), lines)
		}
	}
	return b.String()
}

// metadata asks the broker at addr itself (not a cached view) for cluster
// metadata: a fresh transport fetches it on first use and is then closed.
func metadata(ctx context.Context, addr string, topics ...string) (*kafka.MetadataResponse, error) {
	tr := &kafka.Transport{ClientID: "kmirror-harness", DialTimeout: 2 * time.Second}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(addr), Transport: tr}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
	if err != nil {
		return nil, fmt.Errorf("metadata from %s: %w", addr, err)
	}
	return md, nil
}
