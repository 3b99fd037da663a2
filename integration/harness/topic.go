package harness

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
)

// CreateTopic creates a topic and waits until every running broker's
// metadata shows a leader for each of its partitions.
func (c *Cluster) CreateTopic(ctx context.Context, name string, partitions, rf int, configs map[string]string) error {
	var addrs []string
	for _, n := range c.brokers {
		if c.running(n) != nil {
			addrs = append(addrs, n.addr())
		}
	}
	if len(addrs) == 0 {
		return fmt.Errorf("harness: creating topic %q: no broker of cluster %s is running", name, c.name)
	}
	keys := make([]string, 0, len(configs))
	for k := range configs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	entries := make([]kafka.ConfigEntry, len(keys))
	for i, k := range keys {
		entries[i] = kafka.ConfigEntry{ConfigName: k, ConfigValue: configs[k]}
	}

	tr := &kafka.Transport{ClientID: "kmirror-harness", DialTimeout: 2 * time.Second}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(addrs...), Transport: tr, Timeout: 30 * time.Second}
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic:             name,
		NumPartitions:     partitions,
		ReplicationFactor: rf,
		ConfigEntries:     entries,
	}}})
	if err != nil {
		return fmt.Errorf("harness: creating topic %q: %w", name, err)
	}
	if err := res.Errors[name]; err != nil {
		return fmt.Errorf("harness: creating topic %q (%d partitions, replication factor %d): %w", name, partitions, rf, err)
	}

	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	return c.poll(ctx, "to show leaders for topic "+strconv.Quote(name), func(ctx context.Context) error {
		for _, addr := range addrs {
			md, err := metadata(ctx, addr, name)
			if err != nil {
				return err
			}
			if len(md.Topics) != 1 || md.Topics[0].Error != nil {
				return fmt.Errorf("broker at %s does not know topic %q yet", addr, name)
			}
			t := md.Topics[0]
			if len(t.Partitions) != partitions {
				return fmt.Errorf("broker at %s lists %d of %d partitions", addr, len(t.Partitions), partitions)
			}
			for _, p := range t.Partitions {
				// An unknown leader id maps to a zero Broker in kafka-go.
				if p.Leader.Host == "" {
					return fmt.Errorf("broker at %s has no leader for partition %d", addr, p.ID)
				}
			}
		}
		return nil
	})
}
