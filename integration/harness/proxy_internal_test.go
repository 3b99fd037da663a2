package harness

import (
	"encoding/binary"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// produceFrame encodes a Produce request with franz-go (an encoder nobody
// here wrote) behind a v1 request header, as a client sends it.
func produceFrame(version int16, topics ...string) []byte {
	req := kmsg.NewPtrProduceRequest()
	req.Version = version
	req.Acks = -1
	for i, name := range topics {
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic = name
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Partition = int32(i)
		rp.Records = []byte("not a real batch, only its length matters")
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
	}
	b := binary.BigEndian.AppendUint32(nil, 0)
	b = binary.BigEndian.AppendUint16(b, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(version))
	b = binary.BigEndian.AppendUint32(b, 7)
	b = binary.BigEndian.AppendUint16(b, 7)
	b = append(b, "kmirror"...)
	b = req.AppendTo(b)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

func TestCarriesTopic(t *testing.T) {
	cases := []struct {
		frame []byte
		topic string
		want  bool
	}{
		{produceFrame(8, "a", "late-one"), "late-one", true},
		{produceFrame(8, "a", "late-one"), "late", false},
		{produceFrame(8, "lost-eight"), "lost-*", true},
		{produceFrame(8, "__kmirror_offsets"), "lost-*", false},
		{produceFrame(3, "x", "y", "z"), "z", true},
		{produceFrame(9, "late-one"), "late-one", false}, // flexible versions are not parsed
	}
	for i, c := range cases {
		if got := carriesTopic(c.frame, c.topic); got != c.want {
			t.Errorf("case %d: carriesTopic(%v, %q) = %v, want %v", i, produceTopics(c.frame), c.topic, got, c.want)
		}
	}
}
