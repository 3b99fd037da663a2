package main

import (
	"context"
	"fmt"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
)

const (
	// idleTopicPartitions is the size of each idle topic: KRaft refuses an
	// operation of more than 10,000 records (a topic and its partitions),
	// and fleets hold many topics rather than one huge one.
	idleTopicPartitions = 1000
	// idleSetupTimeout bounds creating, adding and starting the idle
	// partitions; it bounds a hang, not the run time.
	idleSetupTimeout = 10 * time.Minute
	// idleSettle is the wait between the last partition MIRRORING and the
	// measurement, for the start-up work (leases, first fetches,
	// checkpoints) to end.
	idleSettle = 10 * time.Second
)

// idleShares is the CPU each process used over a window, in cores (1.0:
// one core busy the whole window).
type idleShares struct {
	Kmirror     float64 // all members together
	Source      float64 // the source broker's JVM
	Destination float64 // the destination broker's JVM
}

// idleResult is the idle-partition measurement: the same processes
// before and after the idle partitions were added.
type idleResult struct {
	Partitions    int
	Before, After idleShares
	Setup         time.Duration // create, add and all MIRRORING
	Window        time.Duration
}

// measureIdle measures the CPU of kmirror and both brokers while nothing
// is produced, then mirrors --idle-partitions empty partitions (topics of
// idleTopicPartitions each) and measures again.
func (b *bench) measureIdle(ctx context.Context) (idleResult, error) {
	window := time.Duration(b.cfg.IdleSeconds) * time.Second
	res := idleResult{Partitions: b.cfg.IdlePartitions, Window: window}
	var err error
	if res.Before, err = b.idleWindow(ctx, window); err != nil {
		return res, err
	}
	b.printf("before: kmirror %.1f%%, source broker %.1f%%, destination broker %.1f%% of a core over %v",
		100*res.Before.Kmirror, 100*res.Before.Source, 100*res.Before.Destination, window)

	start := time.Now()
	var topics []string
	counts := map[string]int{}
	for left, i := b.cfg.IdlePartitions, 0; left > 0; i++ {
		n := min(left, idleTopicPartitions)
		left -= n
		topic := fmt.Sprintf("idle-%d", i)
		if err := b.src.CreateTopic(ctx, topic, n, 1, nil); err != nil {
			return res, err
		}
		topics = append(topics, topic)
		counts[topic] = n
	}
	b.printf("created %d source topics of up to %d partitions in %.1fs; adding them to the mirror (start from latest)",
		len(topics), idleTopicPartitions, time.Since(start).Seconds())
	if _, err := b.group.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: mirrorName, Topics: topics, StartFrom: "latest"}); err != nil {
		return res, fmt.Errorf("add the idle topics: %w", err)
	}
	deadline := start.Add(idleSetupTimeout)
	for _, topic := range topics {
		for {
			if err := b.group.exited(); err != nil {
				return res, err
			}
			rows, err := b.group.client.Describe(ctx, mirrorName, topic)
			mirroring := 0
			if err == nil {
				for _, r := range rows {
					if r.State == "MIRRORING" && r.SourceOffset >= 0 {
						mirroring++
					}
				}
			}
			if mirroring == counts[topic] {
				break
			}
			if time.Now().After(deadline) {
				return res, fmt.Errorf("%s: %d of %d partitions MIRRORING %v after the idle topics were created (describe error: %v)",
					topic, mirroring, counts[topic], idleSetupTimeout, err)
			}
			if err := sleepCtx(ctx, time.Second); err != nil {
				return res, err
			}
		}
	}
	res.Setup = time.Since(start)
	b.printf("all %d idle partitions MIRRORING %.1fs after the first topic was created; measuring after %v", b.cfg.IdlePartitions, res.Setup.Seconds(), idleSettle)
	if err := sleepCtx(ctx, idleSettle); err != nil {
		return res, err
	}
	if res.After, err = b.idleWindow(ctx, window); err != nil {
		return res, err
	}
	b.printf("with %d idle partitions: kmirror %.1f%%, source broker %.1f%%, destination broker %.1f%% of a core over %v",
		b.cfg.IdlePartitions, 100*res.After.Kmirror, 100*res.After.Source, 100*res.After.Destination, window)
	return res, nil
}

// idleWindow samples the CPU time of kmirror's members and both brokers
// at the start and the end of window.
func (b *bench) idleWindow(ctx context.Context, window time.Duration) (idleShares, error) {
	read := func() (k, s, d time.Duration, err error) {
		g, err := b.group.sample(b.ticks)
		if err != nil {
			return 0, 0, 0, err
		}
		var cpu [2]time.Duration
		for i, cl := range [2]interface{ BrokerPID(int) (int, error) }{b.src, b.dst} {
			pid, err := cl.BrokerPID(0)
			if err != nil {
				return 0, 0, 0, err
			}
			ps, err := sample(pid, b.ticks)
			if err != nil {
				return 0, 0, 0, err
			}
			cpu[i] = ps.CPU
		}
		return g.CPU, cpu[0], cpu[1], nil
	}
	k0, s0, d0, err := read()
	if err != nil {
		return idleShares{}, err
	}
	t0 := time.Now()
	if err := sleepCtx(ctx, window); err != nil {
		return idleShares{}, err
	}
	k1, s1, d1, err := read()
	if err != nil {
		return idleShares{}, err
	}
	wall := time.Since(t0).Seconds()
	return idleShares{Kmirror: (k1 - k0).Seconds() / wall, Source: (s1 - s0).Seconds() / wall, Destination: (d1 - d0).Seconds() / wall}, nil
}
