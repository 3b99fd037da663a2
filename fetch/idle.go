package fetch

import (
	"fmt"
	"time"

	"github.com/segmentio/kafka-go/protocol/listoffsets"
	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// idleCheck is how often the destination of idle partitions is checked for
// records past what kmirror acknowledged: a late copy of one of its own
// batches (fetch/DESIGN.md) or a foreign write. A partition that sends is
// checked by every produce answer; an idle one would otherwise show a
// clean state, and record a wrong last mirrored position, until its next
// batch.
const idleCheck = 5 * time.Second

// checkIdle asks each destination leader for the high watermark of the
// partitions that have been idle since the previous check; a partition
// whose destination holds more than kmirror acknowledged is confirmed
// (walked), which names what the extra records are.
func (e *Engine) checkIdle() {
	type idle struct {
		p   *partition
		dst int64
	}
	byBroker := map[string][]idle{}
	e.mu.Lock()
	for _, p := range e.parts {
		quiet := p.mirroring() && p.send == sendIdle && len(p.queue) == 0 && p.dstLeader >= 0
		if quiet && p.idleSeen == p.pos.DestinationOffset {
			if w := e.senders[p.dstLeader]; w != nil {
				byBroker[w.addr] = append(byBroker[w.addr], idle{p, p.pos.DestinationOffset})
			}
		}
		p.idleSeen = -1
		if quiet {
			p.idleSeen = p.pos.DestinationOffset
		}
	}
	e.mu.Unlock()
	for addr, ps := range byBroker {
		keys := make([]Key, len(ps))
		for i, x := range ps {
			keys[i] = x.p.key()
		}
		hw, err := e.highWatermarks(addr, keys)
		if err != nil {
			e.log.Debug("idle check of the destination", zap.String("broker", addr), zap.Error(err))
			continue
		}
		e.mu.Lock()
		for i, x := range ps {
			p := x.p
			h, ok := hw[keys[i]]
			if !ok && p.mirroring() && p.dstLeader >= 0 {
				// The leader could not answer for it (the topic was
				// deleted, the leadership moved): route it again, which
				// finds out which and reports a missing topic.
				p.dstLeader = -1
				kick(e.kickRt)
				continue
			}
			if !ok || h <= x.dst || p.pos.DestinationOffset != x.dst || !p.mirroring() || p.send != sendIdle {
				continue
			}
			e.confirmLocked(p, fmt.Sprintf("destination %s/%d holds offsets %d..%d after kmirror's last acknowledged batch",
				keys[i].Topic, keys[i].Partition, x.dst, h-1))
		}
		e.mu.Unlock()
	}
}

// highWatermarks lists the high watermarks of partitions led by the broker
// at addr, in one ListOffsets request (latest offset, read_uncommitted).
// Partitions with an error are left out.
func (e *Engine) highWatermarks(addr string, keys []Key) (map[Key]int64, error) {
	ctx, cancel := kafka.ExchangeCtx(e.ctx)
	defer cancel()
	conn, err := e.dest.Borrow(ctx, addr)
	if err != nil {
		return nil, err
	}
	broken := true
	defer func() {
		if broken {
			conn.Close()
		} else {
			e.dest.GiveBack(addr, conn)
		}
	}()
	req := &listoffsets.Request{ReplicaID: -1}
	byTopic := map[string]int{}
	for _, k := range keys {
		i, ok := byTopic[k.Topic]
		if !ok {
			i = len(req.Topics)
			byTopic[k.Topic] = i
			req.Topics = append(req.Topics, listoffsets.RequestTopic{Topic: k.Topic})
		}
		req.Topics[i].Partitions = append(req.Topics[i].Partitions,
			listoffsets.RequestPartition{Partition: k.Partition, CurrentLeaderEpoch: -1, Timestamp: -1})
	}
	msg, err := conn.RoundTrip(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("list offsets on %s: %w", addr, err)
	}
	broken = false
	asked := make(map[kwire.TopicPartition]Key, len(keys))
	for _, k := range keys {
		asked[kwire.TopicPartition{Topic: k.Topic, Partition: k.Partition}] = k
	}
	out := make(map[Key]int64, len(keys))
	for _, t := range msg.(*listoffsets.Response).Topics {
		for _, p := range t.Partitions {
			if k, ok := asked[kwire.TopicPartition{Topic: t.Topic, Partition: p.Partition}]; ok && p.ErrorCode == 0 {
				out[k] = p.Offset
			}
		}
	}
	return out, nil
}
