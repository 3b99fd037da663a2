package harness

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Options describes a cluster to start. The zero value is a one-broker
// cluster in a temporary folder.
type Options struct {
	// Name prefixes the temporary folder and log lines. Default "kafka".
	Name string
	// Brokers is the number of brokers. Default 1 (one combined
	// broker+controller node); more adds a separate controller node.
	Brokers int
	// KafkaVersion to assemble and run. Default: KAFKA_VERSION, else the
	// version pinned in integration/kafka/assemble.sh.
	KafkaVersion string
	// BrokerProps are extra server.properties for every node; they override
	// the harness's test-speed defaults but may not set listeners, node
	// identity or folders, which the harness owns.
	BrokerProps map[string]string
	// Dir holds the nodes' configs and data. Default: a temporary folder,
	// removed by Close. A given Dir is kept and must not hold an earlier
	// cluster.
	Dir string
	// Log receives the JVMs' stdout and stderr, each line prefixed with the
	// node. Default: kafka.log in Dir.
	Log io.Writer
	// Throughput keeps the JIT's optimising compiler (for benchmarks); by
	// default the JVMs are tuned for fast start-up instead.
	Throughput bool
	// Proxy puts a Proxy (a test hook for lost answers) in front of every
	// broker: brokers advertise the proxy's address, so every client,
	// the brokers' own replication included, goes through it.
	Proxy bool
	// Listeners adds client listeners beside PLAINTEXT (which the brokers,
	// the harness and Kafka's tools keep using), each named after its
	// security protocol: "SSL", "SASL_SSL" or "SASL_PLAINTEXT". Their
	// settings go in BrokerProps as listener.name.<name>.<config>; find
	// their addresses with ListenerAddrs. "PROXIED" adds a plaintext
	// listener whose advertised address is a Proxy (ListenerProxy): the
	// clients bootstrapped there, and they alone, go through the proxies,
	// so one client's link can stall while the others' do not.
	Listeners []string
	// FormatArgs are extra arguments to kafka-storage format, such as
	// --add-scram 'SCRAM-SHA-512=[name=alice,password=secret]' (KIP-900).
	FormatArgs []string
	// ZooKeeper runs the cluster in ZooKeeper mode (Kafka before 4.0):
	// one ZooKeeper node, from the zookeeper jar the Kafka version
	// depends on, and brokers that register with it; no KRaft controller
	// and no storage format. The cluster ID is the one the brokers create.
	// Not with FormatArgs (SCRAM credentials live in ZooKeeper there).
	ZooKeeper bool
	// DelayLine runs the nodes in its network namespace: clients here
	// reach the brokers (at DelayLine.Remote) across its round trip, while
	// the nodes reach each other inside the namespace at once. Not with
	// Proxy or Listeners.
	DelayLine *DelayLine
	// Classpath entries (directories or jars) go on the brokers'
	// classpath after Kafka's own: plugins such as a create.topic.policy.
	Classpath []string
}

// harnessOwned are server.properties the harness computes per node.
var harnessOwned = []string{
	"process.roles", "node.id", "listeners", "advertised.listeners",
	"controller.listener.names", "controller.quorum.voters",
	"controller.quorum.bootstrap.servers", "inter.broker.listener.name",
	"listener.security.protocol.map", "log.dir", "log.dirs", "metadata.log.dir",
	"broker.id", "zookeeper.connect",
}

// Validate checks the options and names the offending field.
func (o Options) Validate() error {
	if o.Brokers < 0 {
		return fmt.Errorf("harness: Options.Brokers is %d: want 0 (meaning 1) or more", o.Brokers)
	}
	if o.DelayLine != nil && (o.Proxy || len(o.Listeners) > 0) {
		return errors.New("harness: Options.DelayLine cannot be combined with Proxy or Listeners")
	}
	if err := checkMode(o); err != nil {
		return err
	}
	if strings.ContainsRune(o.Name, os.PathSeparator) {
		return fmt.Errorf("harness: Options.Name %q contains a path separator", o.Name)
	}
	for _, k := range harnessOwned {
		if _, ok := o.BrokerProps[k]; ok {
			return fmt.Errorf("harness: Options.BrokerProps sets %q, which the harness computes per node: remove it", k)
		}
	}
	for _, l := range o.Listeners {
		switch l {
		case "SSL", "SASL_SSL", "SASL_PLAINTEXT", proxiedListener:
		default:
			return fmt.Errorf("harness: Options.Listeners holds %q: use SSL, SASL_SSL, SASL_PLAINTEXT or PROXIED", l)
		}
	}
	return nil
}
