package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go/protocol"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// errNoLeader means metadata has no live leader for a partition yet.
var errNoLeader = errors.New("no leader")

// Cluster tracks one Kafka cluster's metadata for the data path and dials
// its brokers. Metadata is always asked fresh from a broker (at most once
// per refreshGap), never served from a stale cache.
type Cluster struct {
	Name      string // for messages: "source cluster of mirror m1", "destination cluster"
	Bootstrap []string
	clientID  string
	security  Security

	// ctrlLock guards ctrl, md and fetched. It is held across network
	// exchanges, so it is a channel: a caller gives up waiting for it when
	// its context ends, instead of queueing behind a silent broker.
	ctrlLock chan struct{}
	ctrl     *kwire.Conn
	md       *kwire.Metadata
	fetched  time.Time

	// idle holds open connections by broker address between walks, so a
	// member taking over many partitions reuses a few connections instead
	// of dialing two per partition.
	idleMu sync.Mutex
	idle   map[string][]idleConn

	topicsMu sync.Mutex
	topics   map[string]bool
	// grown is set when watch adds a topic the cached metadata lacks.
	grown bool
	// FetchedBytes counts record-set bytes fetched (data path and walks).
	FetchedBytes atomic.Int64
}

const refreshGap = 200 * time.Millisecond

// exchangeTimeout bounds one request/response exchange with a broker that
// the caller's context leaves unbounded, so a broker that stops answering
// without closing its connections (a crashed host, a network partition)
// costs a retry, not minutes.
const exchangeTimeout = 15 * time.Second

// ExchangeCtx bounds ctx by exchangeTimeout.
func ExchangeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, exchangeTimeout)
}

func NewCluster(name string, bootstrap []string, clientID string, security Security) *Cluster {
	return &Cluster{Name: name, Bootstrap: bootstrap, clientID: clientID, security: security, topics: map[string]bool{},
		ctrlLock: make(chan struct{}, 1), idle: map[string][]idleConn{}}
}

// idleConn is a pooled connection and when it was given back.
type idleConn struct {
	conn  *kwire.Conn
	since time.Time
}

const (
	// idleLife is how long a pooled connection is reused; brokers close
	// idle connections after connections.max.idle.ms (10 min by default).
	idleLife = 30 * time.Second
)

// Borrow returns a pooled connection to addr, or dials a new one. Give it
// back with giveBack when it is still good, else close it.
func (c *Cluster) Borrow(ctx context.Context, addr string) (*kwire.Conn, error) {
	c.idleMu.Lock()
	for l := c.idle[addr]; len(l) > 0; l = c.idle[addr] {
		ic := l[len(l)-1]
		c.idle[addr] = l[:len(l)-1]
		if time.Since(ic.since) < idleLife {
			c.idleMu.Unlock()
			return ic.conn, nil
		}
		ic.conn.Close()
	}
	c.idleMu.Unlock()
	return c.Dial(ctx, addr)
}

// GiveBack pools a connection whose last exchange succeeded.
func (c *Cluster) GiveBack(addr string, conn *kwire.Conn) {
	c.idleMu.Lock()
	defer c.idleMu.Unlock()
	if len(c.idle[addr]) >= MaxIdlePerBroker {
		conn.Close()
		return
	}
	c.idle[addr] = append(c.idle[addr], idleConn{conn, time.Now()})
}

// lock takes ctrlLock, or returns ctx's error if ctx ends first.
func (c *Cluster) lock(ctx context.Context) error {
	select {
	case c.ctrlLock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: waiting for metadata: %w", c.Name, ctx.Err())
	}
}

func (c *Cluster) unlock() { <-c.ctrlLock }

// Watch adds topics to the set refreshed.
func (c *Cluster) Watch(topics ...string) {
	c.topicsMu.Lock()
	for _, t := range topics {
		if !c.topics[t] {
			c.topics[t] = true
			c.grown = true
		}
	}
	c.topicsMu.Unlock()
}

// Metadata returns metadata no older than maxAge (at least refreshGap),
// refreshing if needed.
func (c *Cluster) Metadata(ctx context.Context, maxAge time.Duration) (*kwire.Metadata, error) {
	return c.MetadataSince(ctx, time.Now().Add(-max(maxAge, refreshGap)))
}

// MetadataSince returns metadata received at or after t, asking a broker
// if the cached one is older or lacks a watched topic.
func (c *Cluster) MetadataSince(ctx context.Context, t time.Time) (*kwire.Metadata, error) {
	if err := c.lock(ctx); err != nil {
		return nil, err
	}
	defer c.unlock()
	c.topicsMu.Lock()
	grown := c.grown
	topics := make([]string, 0, len(c.topics))
	for tp := range c.topics {
		topics = append(topics, tp)
	}
	c.grown = false
	c.topicsMu.Unlock()
	if c.md != nil && !grown && !c.fetched.Before(t) {
		return c.md, nil
	}
	sort.Strings(topics)
	md, err := c.fetchMetadata(ctx, topics)
	if err != nil {
		if grown {
			c.topicsMu.Lock()
			c.grown = true
			c.topicsMu.Unlock()
		}
		return nil, err
	}
	c.md, c.fetched = md, time.Now()
	return md, nil
}

// fetchMetadata asks a known broker, then the bootstrap list, for metadata.
// Called with ctrlLock held.
func (c *Cluster) fetchMetadata(ctx context.Context, topics []string) (*kwire.Metadata, error) {
	var md *kwire.Metadata
	err := c.withCtrlLocked(ctx, func(ctx context.Context, conn *kwire.Conn) (err error) {
		md, err = conn.Metadata(ctx, topics)
		return err
	})
	return md, err
}

// roundTrip sends one of kafka-go's typed requests to any broker of the
// cluster (admin requests: KRaft brokers forward them to the controller).
func (c *Cluster) roundTrip(ctx context.Context, msg protocol.Message) (protocol.Message, error) {
	if err := c.lock(ctx); err != nil {
		return nil, err
	}
	defer c.unlock()
	var res protocol.Message
	err := c.withCtrlLocked(ctx, func(ctx context.Context, conn *kwire.Conn) (err error) {
		res, err = conn.RoundTrip(ctx, msg)
		return err
	})
	return res, err
}

// withCtrlLocked runs f on the control connection; if the connection is
// broken (a restarted broker, or one a firewall dropped silently), it
// reconnects to a known or bootstrap broker and runs f once more. Every
// attempt has its own exchangeTimeout bound (f gets the bounded context),
// so a dead cached connection costs one bound, not the reconnect's too.
// Called with ctrlLock held.
func (c *Cluster) withCtrlLocked(ctx context.Context, f func(context.Context, *kwire.Conn) error) error {
	attempt := func(conn *kwire.Conn) error {
		ctx, cancel := ExchangeCtx(ctx)
		defer cancel()
		return f(ctx, conn)
	}
	if c.ctrl != nil {
		err := attempt(c.ctrl)
		var kerr *kwire.Error
		if err == nil || errors.As(err, &kerr) {
			return err
		}
		c.ctrl.Close()
		c.ctrl = nil
	}
	addrs := append([]string(nil), c.Bootstrap...)
	if c.md != nil {
		for _, a := range c.md.Brokers {
			if !slices.Contains(addrs, a) {
				addrs = append(addrs, a)
			}
		}
	}
	var errs []error
	for _, a := range addrs {
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break
		}
		dctx, cancel := ExchangeCtx(ctx)
		conn, err := c.dialSecure(dctx, a)
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c.ctrl = conn
		if err := attempt(conn); err != nil {
			var kerr *kwire.Error
			if errors.As(err, &kerr) {
				return err
			}
			conn.Close()
			c.ctrl = nil
			errs = append(errs, err)
			continue
		}
		return nil
	}
	how := "unreachable"
	if slices.ContainsFunc(errs, SecurityFailure) {
		how = "refused kmirror's connection"
	}
	return &joinedError{prefix: fmt.Sprintf("%s %s (bootstrap %s)", c.Name, how, strings.Join(c.Bootstrap, ",")), errs: errs}
}

// joinedError is one line naming several errors, each still found by
// errors.Is and errors.As.
type joinedError struct {
	prefix string
	errs   []error
}

func (j *joinedError) Error() string {
	parts := make([]string, len(j.errs))
	for i, e := range j.errs {
		parts[i] = e.Error()
	}
	return j.prefix + ": " + strings.Join(parts, "; ")
}

func (j *joinedError) Unwrap() []error { return j.errs }

// SecurityFailure reports whether err is a failure only the operator can
// fix: authentication (certificates, credentials, unreadable settings) or
// authorization (a missing ACL). A cluster that refuses kmirror this way
// is up.
func SecurityFailure(err error) bool {
	var kerr *kwire.Error
	return errors.Is(err, kwire.ErrAuthentication) || (errors.As(err, &kerr) && kwire.IsAuthorization(kerr.Code))
}

// Leader returns the leader broker address and epoch of a partition.
func (c *Cluster) Leader(ctx context.Context, topic string, partition int32, maxAge time.Duration) (id int32, addr string, epoch int32, err error) {
	c.Watch(topic)
	md, err := c.Metadata(ctx, maxAge)
	if err != nil {
		return -1, "", -1, err
	}
	if code, ok := md.TopicErrors[topic]; ok {
		return -1, "", -1, &kwire.Error{Code: code, Topic: topic, Partition: partition, Op: "metadata of " + c.Name}
	}
	parts, ok := md.Topics[topic]
	if !ok || int(partition) >= len(parts) {
		// The topic may have been added since the last refresh.
		if maxAge > 0 {
			return c.Leader(ctx, topic, partition, 0)
		}
		return -1, "", -1, fmt.Errorf("%s has no partition %s/%d", c.Name, topic, partition)
	}
	p := parts[partition]
	a, ok := md.Brokers[p.Leader]
	if p.Leader < 0 || !ok {
		return -1, "", -1, fmt.Errorf("%s/%d on %s: %w", topic, partition, c.Name, errNoLeader)
	}
	return p.Leader, a, p.LeaderEpoch, nil
}

// ListOffset asks a partition's leader for its earliest or latest (high
// watermark) offset, on a pooled connection.
func (c *Cluster) ListOffset(ctx context.Context, topic string, partition int32, which int64) (int64, error) {
	_, addr, epoch, err := c.Leader(ctx, topic, partition, 0)
	if err != nil {
		return 0, err
	}
	conn, err := c.Borrow(ctx, addr)
	if err != nil {
		return 0, err
	}
	rctx, cancel := ExchangeCtx(ctx)
	defer cancel()
	off, err := listOffset(rctx, conn, c.Name, topic, partition, epoch, which)
	var kerr *kwire.Error
	if err != nil && !errors.As(err, &kerr) {
		conn.Close()
		return 0, err
	}
	c.GiveBack(addr, conn)
	return off, err
}

// Dial opens a new connection to a broker by address; the connect and the
// API-version handshake are bounded by exchangeTimeout.
func (c *Cluster) Dial(ctx context.Context, addr string) (*kwire.Conn, error) {
	ctx, cancel := ExchangeCtx(ctx)
	defer cancel()
	conn, err := c.dialSecure(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Name, err)
	}
	return conn, nil
}

// dialSecure resolves the cluster's security settings (fresh at every
// dial, so replaced certificate and secret files apply to new
// connections) and dials addr with them.
func (c *Cluster) dialSecure(ctx context.Context, addr string) (*kwire.Conn, error) {
	var sec *kwire.Security
	if c.security != nil {
		var err error
		if sec, err = c.security(); err != nil {
			return nil, fmt.Errorf("%w: %w", kwire.ErrAuthentication, err)
		}
	}
	return kwire.Dial(ctx, addr, c.clientID, sec)
}

func (c *Cluster) Close() {
	c.lock(context.Background())
	defer c.unlock()
	if c.ctrl != nil {
		c.ctrl.Close()
		c.ctrl = nil
	}
	c.idleMu.Lock()
	defer c.idleMu.Unlock()
	for addr, l := range c.idle {
		for _, ic := range l {
			ic.conn.Close()
		}
		delete(c.idle, addr)
	}
}
