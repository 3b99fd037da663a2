package kwire

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// fetchBody builds a Fetch v11 response body (after the correlation ID).
func fetchBody(code int16, session int32, topics map[string][]FetchedPartition, order []string, trailer []byte) []byte {
	w := &writer{}
	w.int32(0) // throttle
	w.int16(code)
	w.int32(session)
	w.int32(int32(len(order)))
	for _, topic := range order {
		w.string(topic)
		w.int32(int32(len(topics[topic])))
		for _, p := range topics[topic] {
			w.int32(p.Partition)
			w.int16(p.Err)
			w.int64(p.HighWatermark)
			w.int64(p.LastStableOffset)
			w.int64(p.LogStartOffset)
			if p.Aborted == nil {
				w.int32(-1)
			} else {
				w.int32(int32(len(p.Aborted)))
				for _, a := range p.Aborted {
					w.int64(a.ProducerID)
					w.int64(a.FirstOffset)
				}
			}
			w.int32(-1) // preferred read replica
			if p.Records == nil {
				w.int32(-1)
			} else {
				w.bytes(p.Records)
			}
		}
	}
	return append(w.b, trailer...)
}

// TestFetchResponseReadInPlace: a fetch answer is read field by field,
// each partition's records straight into a buffer of its own, with the
// same result a whole-body parse gave; bytes after the known fields are
// read too, and a top-level error leaves the connection in step, so the
// answers after them parse (issue 20: no copy of the body).
func TestFetchResponseReadInPlace(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 5000/16)
	topics := map[string][]FetchedPartition{
		"a": {
			{Partition: 0, HighWatermark: 10, LastStableOffset: 9, LogStartOffset: 2,
				Aborted: []AbortedTxn{{ProducerID: 7, FirstOffset: 3}, {ProducerID: 8, FirstOffset: 5}}, Records: big},
			{Partition: 3, Err: 6, HighWatermark: -1, LastStableOffset: -1, LogStartOffset: -1},
		},
		"bb": {{Partition: 1, HighWatermark: 4, LastStableOffset: 4, Records: []byte("tiny")}},
	}
	answers := [][]byte{
		fetchBody(0, 42, topics, []string{"a", "bb"}, []byte{1, 2, 3, 4, 5, 6, 7}),
		fetchBody(CodeFetchSessionIDNotFound, 0, nil, nil, []byte{9, 9, 9}),
		fetchBody(0, 43, map[string][]FetchedPartition{"bb": topics["bb"]}, []string{"bb"}, nil),
	}
	client, broker := net.Pipe()
	defer client.Close()
	defer broker.Close()
	conn := &Conn{addr: "pipe", nc: client, br: bufio.NewReader(client), clientID: "test"}
	go func() {
		for _, a := range answers {
			var size [4]byte
			if _, err := io.ReadFull(broker, size[:]); err != nil {
				return
			}
			req := make([]byte, binary.BigEndian.Uint32(size[:]))
			if _, err := io.ReadFull(broker, req); err != nil {
				return
			}
			out := binary.BigEndian.AppendUint32(nil, uint32(4+len(a)))
			out = append(out, req[4:8]...) // correlation ID
			if _, err := broker.Write(append(out, a...)); err != nil {
				return
			}
		}
	}()
	fetch := func() (*FetchResponse, error) {
		return conn.FetchSession(context.Background(), &FetchRequest{MaxBytes: 1 << 20, SessionEpoch: NoSession})
	}
	res, err := fetch()
	if err != nil {
		t.Fatal(err)
	}
	if res.SessionID != 42 || len(res.Partitions) != 3 {
		t.Fatalf("session %d, %d partitions, want 42 and 3: %+v", res.SessionID, len(res.Partitions), res.Partitions)
	}
	want := append(append([]FetchedPartition{}, topics["a"]...), topics["bb"]...)
	for i, fp := range res.Partitions {
		w := want[i]
		w.Topic = map[int]string{0: "a", 1: "a", 2: "bb"}[i]
		if fp.Topic != w.Topic || fp.Partition != w.Partition || fp.Err != w.Err || fp.HighWatermark != w.HighWatermark ||
			fp.LastStableOffset != w.LastStableOffset || fp.LogStartOffset != w.LogStartOffset ||
			len(fp.Aborted) != len(w.Aborted) || !bytes.Equal(fp.Records, w.Records) {
			t.Fatalf("partition %d read as %+v, want %+v", i, fp, w)
		}
		for j := range w.Aborted {
			if fp.Aborted[j] != w.Aborted[j] {
				t.Fatalf("partition %d aborted %v, want %v", i, fp.Aborted, w.Aborted)
			}
		}
	}
	kept := res.Detach(0)
	if res.Partitions[0].Records != nil || !bytes.Equal(kept, big) || RecordsCap(kept) < int64(len(big)) {
		t.Fatalf("detached %d bytes (cap %d), the response still has %d", len(kept), RecordsCap(kept), len(res.Partitions[0].Records))
	}
	res.Release()
	if !bytes.Equal(kept, big) {
		t.Fatal("a detached record buffer changed when the response was released")
	}
	ReleaseRecords(kept)

	_, err = fetch()
	var kerr *Error
	if !errors.As(err, &kerr) || kerr.Code != CodeFetchSessionIDNotFound {
		t.Fatalf("answer with a top-level error: %v, want code %d", err, CodeFetchSessionIDNotFound)
	}
	res, err = fetch()
	if err != nil || res.SessionID != 43 || len(res.Partitions) != 1 || string(res.Partitions[0].Records) != "tiny" {
		t.Fatalf("the answer after an error and a trailer: %+v, %v", res, err)
	}
}

// deadlineCounter counts the read deadlines set on a connection.
type deadlineCounter struct {
	net.Conn
	n atomic.Int64
}

func (d *deadlineCounter) SetReadDeadline(t time.Time) error {
	d.n.Add(1)
	return d.Conn.SetReadDeadline(t)
}

// TestManyTinyRecordSets: an answer of 10,000 partitions with a tiny
// record set each (idle partitions with one record, or a hostile broker)
// holds no more memory than its record bytes plus a quarter (a 4 KiB
// buffer each held ~40x: issue 20 review), and is read with a read
// deadline set per socket read, not per field (90,000 deadlines cost
// 17 ms for one answer).
func TestManyTinyRecordSets(t *testing.T) {
	const partitions = 10000
	var parts []FetchedPartition
	var recordBytes int
	for p := range partitions {
		size := 100
		switch p % 1000 {
		case 1:
			size = 1
		case 2:
			size = 5000 // one of a class: under a quarter wasted
		}
		parts = append(parts, FetchedPartition{Partition: int32(p), Records: bytes.Repeat([]byte{byte(p)}, size)})
		recordBytes += size
	}
	body := fetchBody(0, 7, map[string][]FetchedPartition{"t": parts}, []string{"t"}, nil)
	client, broker := net.Pipe()
	defer client.Close()
	defer broker.Close()
	counted := &deadlineCounter{Conn: client}
	conn := &Conn{addr: "pipe", nc: counted, br: bufio.NewReader(counted), clientID: "test"}
	go func() {
		var size [4]byte
		if _, err := io.ReadFull(broker, size[:]); err != nil {
			return
		}
		req := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(broker, req); err != nil {
			return
		}
		out := binary.BigEndian.AppendUint32(nil, uint32(4+len(body)))
		out = append(out, req[4:8]...)
		broker.Write(append(out, body...))
	}()
	res, err := conn.FetchSession(context.Background(), &FetchRequest{MaxBytes: 1 << 30, MaxWait: time.Second, SessionEpoch: NoSession})
	if err != nil {
		t.Fatal(err)
	}
	defer res.Release()
	if len(res.Partitions) != partitions {
		t.Fatalf("%d partitions read, want %d", len(res.Partitions), partitions)
	}
	var held int64
	for i, fp := range res.Partitions {
		if !bytes.Equal(fp.Records, parts[i].Records) {
			t.Fatalf("partition %d: %d bytes read, want %d", i, len(fp.Records), len(parts[i].Records))
		}
		held += RecordsCap(fp.Records)
	}
	if held > int64(recordBytes)*5/4 {
		t.Fatalf("%d record bytes held in %d bytes of buffers (over 1.25x)", recordBytes, held)
	}
	socketReads := len(body)/4096 + 1
	if n := counted.n.Load(); n > int64(socketReads)+10 {
		t.Fatalf("%d read deadlines set for an answer of %d bytes (at most %d socket reads of 4 KiB)", n, len(body), socketReads)
	}
	t.Logf("%d record bytes held in %d; %d read deadlines for %d bytes", recordBytes, held, counted.n.Load(), len(body))
}
