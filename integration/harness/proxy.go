package harness

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// apiProduce is Kafka's Produce API key.
const apiProduce = 0

// Proxy is a TCP proxy in front of one broker (Options.Proxy), a test hook
// for answers that are lost on the way: it passes Kafka frames both ways
// and, when armed, either swallows the answer to a produce request after
// the broker has handled it, or holds a produce request back and delivers
// it later, after the client has given up on it. In both cases it closes
// the client's connection at that moment, so the client sees a produce
// whose outcome it cannot know.
type Proxy struct {
	relays // to the broker's own listener

	mu        sync.Mutex
	dropTopic string
	dropLeft  int
	dropDelay time.Duration
	dropped   int
	holdTopic string
	holdLeft  int
	// holdOpen: a held request leaves the client's connection open (a
	// link that froze with the request in it), instead of closing it.
	holdOpen bool
	held     [][]byte
	accepted int
	// stalled: nothing passes either way, the connections stay open (a
	// link that stalls without RST or FIN).
	stalled bool
}

// Stall stops (on) or resumes passing anything either way, keeping every
// connection open: a stalled link, not a broken one.
func (p *Proxy) Stall(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalled = on
}

// waitUnstalled returns once the proxy is not stalled (or closed).
func (p *Proxy) waitUnstalled() {
	for {
		p.mu.Lock()
		stalled := p.stalled
		p.mu.Unlock()
		if !stalled || p.isClosed() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// NewProxy starts a proxy on a free loopback port in front of target (a
// host:port), for tests outside the harness's clusters (Stall, drops).
func NewProxy(target string) (*Proxy, error) { return newProxy("127.0.0.1:0", target) }

func newProxy(listen, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("harness: proxy listener %s: %w", listen, err)
	}
	p := &Proxy{relays: newRelays(ln, target)}
	go p.acceptEach(func() {
		p.mu.Lock()
		p.accepted++
		p.mu.Unlock()
	}, p.serve)
	return p, nil
}

// Addr is the address clients use (the broker advertises it).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// DropProduceResponses makes the proxy swallow the answers to the next n
// produce requests that write to topic (a name, or "prefix*"), once the broker has sent them (so
// the records are appended), and close the client's connection closeAfter
// later: the client learns of the failure only then, as it would from its
// request timeout.
func (p *Proxy) DropProduceResponses(topic string, n int, closeAfter time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropTopic, p.dropLeft, p.dropDelay = topic, n, closeAfter
}

// Dropped counts the produce answers swallowed so far.
func (p *Proxy) Dropped() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

// HoldProduceRequests makes the proxy keep the next n produce requests that
// write to topic (a name, or "prefix*") instead of passing them on, closing the client's connection
// each time; ReleaseHeld delivers them.
func (p *Proxy) HoldProduceRequests(topic string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holdTopic, p.holdLeft, p.holdOpen = topic, n, false
}

// FreezeProduceRequests is HoldProduceRequests that leaves the client's
// connection open: the client waits for an answer that never comes, as
// behind a link that froze while it held the request (issue 19).
func (p *Proxy) FreezeProduceRequests(topic string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holdTopic, p.holdLeft, p.holdOpen = topic, n, true
}

// Held counts the produce requests held and not yet released.
func (p *Proxy) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held)
}

// ReleaseHeld sends every held request to the broker, each on a connection
// of its own, and waits for the broker's answers (which nobody reads): a
// request that a client gave up on arrives late.
func (p *Proxy) ReleaseHeld() error {
	p.mu.Lock()
	held := p.held
	p.held = nil
	p.mu.Unlock()
	for _, frame := range held {
		c, err := net.DialTimeout("tcp", p.target, 10*time.Second)
		if err != nil {
			return fmt.Errorf("harness: proxy releasing a held request: %w", err)
		}
		c.SetDeadline(time.Now().Add(30 * time.Second))
		_, err = c.Write(frame)
		if err == nil {
			_, err = readFrame(c)
		}
		c.Close()
		if err != nil {
			return fmt.Errorf("harness: proxy releasing a held request: %w", err)
		}
	}
	return nil
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() error { return p.close() }

// Accepted counts the client connections the proxy has accepted.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// serve relays one client connection. Requests are read frame by frame so
// that produce requests can be recognised (API key, correlation ID) and
// their answers matched.
func (p *Proxy) serve(client, broker net.Conn) {
	var mu sync.Mutex
	drop := map[int32]bool{} // correlation IDs whose answers are swallowed
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The broker's side ending ends the client's too, as a broker that
		// closes a connection would.
		defer p.untrack(client, broker)
		for {
			frame, err := readFrame(broker)
			if err != nil {
				return
			}
			mu.Lock()
			swallow := drop[int32(binary.BigEndian.Uint32(frame[4:]))]
			mu.Unlock()
			if swallow {
				p.mu.Lock()
				delay := p.dropDelay
				p.mu.Unlock()
				time.Sleep(delay)
				p.untrack(client, broker)
				return
			}
			p.waitUnstalled()
			if _, err := client.Write(frame); err != nil {
				return
			}
		}
	}()
	for {
		frame, err := readFrame(client)
		if err != nil {
			break
		}
		switch p.classify(frame) {
		case "hold-open":
			continue
		case "hold":
			p.untrack(client, broker)
		case "drop":
			mu.Lock()
			drop[int32(binary.BigEndian.Uint32(frame[8:]))] = true
			mu.Unlock()
		}
		p.waitUnstalled()
		if _, err := broker.Write(frame); err != nil {
			break
		}
	}
	p.untrack(client, broker)
	<-done
}

// classify decides what happens to a request frame: "hold" (kept for
// ReleaseHeld, not passed on), "drop" (passed on, answer swallowed) or "".
func (p *Proxy) classify(frame []byte) string {
	if len(frame) < 12 || int16(binary.BigEndian.Uint16(frame[4:])) != apiProduce {
		return ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.holdLeft > 0 && carriesTopic(frame, p.holdTopic):
		p.holdLeft--
		p.held = append(p.held, frame)
		if p.holdOpen {
			return "hold-open"
		}
		return "hold"
	case p.dropLeft > 0 && carriesTopic(frame, p.dropTopic):
		p.dropLeft--
		p.dropped++
		return "drop"
	}
	return ""
}

// carriesTopic reports whether a produce request writes to a topic named
// topic, or starting with it when topic ends in '*'. It parses the
// request's topic names (Produce v3..v8, the non-flexible versions kmirror
// sends); other versions never match.
func carriesTopic(frame []byte, topic string) bool {
	prefix, isPrefix := strings.CutSuffix(topic, "*")
	for _, name := range produceTopics(frame) {
		if name == topic || (isPrefix && strings.HasPrefix(name, prefix)) {
			return true
		}
	}
	return false
}

// produceTopics returns the topic names of a Produce v3..v8 request frame.
func produceTopics(frame []byte) []string {
	b := frame[4:]
	if v := int16(binary.BigEndian.Uint16(b[2:])); v < 3 || v > 8 {
		return nil
	}
	b = b[8:] // api key, version, correlation ID
	str := func() (string, bool) {
		if len(b) < 2 {
			return "", false
		}
		n := int(int16(binary.BigEndian.Uint16(b)))
		b = b[2:]
		if n < 0 {
			return "", true
		}
		if len(b) < n {
			return "", false
		}
		s := string(b[:n])
		b = b[n:]
		return s, true
	}
	i32 := func() (int, bool) {
		if len(b) < 4 {
			return 0, false
		}
		v := int(int32(binary.BigEndian.Uint32(b)))
		b = b[4:]
		return v, true
	}
	var names []string
	if _, ok := str(); !ok { // client ID
		return nil
	}
	if _, ok := str(); !ok { // transactional ID
		return nil
	}
	if len(b) < 6 { // acks, timeout
		return nil
	}
	b = b[6:]
	nt, ok := i32()
	for t := 0; ok && t < nt; t++ {
		var name string
		if name, ok = str(); !ok {
			break
		}
		names = append(names, name)
		np, ok2 := i32()
		for p := 0; ok2 && p < np; p++ {
			var size int
			if _, ok2 = i32(); ok2 {
				size, ok2 = i32()
			}
			if ok2 && size > 0 {
				if size > len(b) {
					ok2 = false
				} else {
					b = b[size:]
				}
			}
		}
		ok = ok2
	}
	return names
}

// readFrame reads one size-prefixed Kafka frame, prefix included.
func readFrame(r io.Reader) ([]byte, error) {
	var size [4]byte
	if _, err := io.ReadFull(r, size[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(size[:])
	if n < 8 || n > 256<<20 {
		return nil, errors.New("harness: proxy: implausible kafka frame size")
	}
	frame := make([]byte, 4+n)
	copy(frame, size[:])
	_, err := io.ReadFull(r, frame[4:])
	return frame, err
}
