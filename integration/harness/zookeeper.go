package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ZooKeeper mode (Options.ZooKeeper): Kafka before 4.0 keeps its metadata
// in ZooKeeper, which the harness runs as one more JVM from the zookeeper
// jar the Kafka version depends on (kafka_2.13's own dependency, so
// assemble.sh brings it: 3.5.9 for Kafka 2.8.2, 3.8.4 for 3.9.1).

const (
	zkRole        = "zookeeper"
	zooKeeperMain = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
	// defaultKafkaVersion is the version assemble.sh pins.
	defaultKafkaVersion = "4.1.1"
)

func (n *node) zooKeeperConfig() string {
	return filepath.Join(n.dir, "zoo.cfg")
}

// writeZooKeeperConfig writes a standalone ZooKeeper's config: data in the
// node's folder, the client port, no admin server (it would take port
// 8080) and the four-letter words for debugging.
func writeZooKeeperConfig(n *node) error {
	cfg := fmt.Sprintf("tickTime=500\ninitLimit=10\nsyncLimit=5\ndataDir=%s\nclientPort=%d\nclientPortAddress=127.0.0.1\n"+
		"admin.enableServer=false\n4lw.commands.whitelist=*\nmaxClientCnxns=0\n", filepath.Join(n.dir, "data"), n.cport)
	if err := os.WriteFile(n.zooKeeperConfig(), []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	return nil
}

// kafkaMajorMinor parses a Kafka version ("" means KAFKA_VERSION, else the
// pinned default) into its major and minor numbers.
func kafkaMajorMinor(version string) (major, minor int, err error) {
	if version == "" {
		version = os.Getenv("KAFKA_VERSION")
	}
	if version == "" {
		version = defaultKafkaVersion
	}
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return 0, 0, fmt.Errorf("harness: Kafka version %q: want MAJOR.MINOR.PATCH, such as 3.9.1", version)
	}
	if major, err = strconv.Atoi(parts[0]); err == nil {
		minor, err = strconv.Atoi(parts[1])
	}
	if err != nil {
		return 0, 0, fmt.Errorf("harness: Kafka version %q: want MAJOR.MINOR.PATCH, such as 3.9.1", version)
	}
	return major, minor, nil
}

// checkMode refuses a metadata mode the Kafka version does not have:
// ZooKeeper from 4.0 on (KIP-833 removed it), KRaft before 3.3 (2.8's was
// an early-access preview without transactions or ACLs).
func checkMode(o Options) error {
	major, minor, err := kafkaMajorMinor(o.KafkaVersion)
	if err != nil {
		return err
	}
	switch {
	case o.ZooKeeper && major >= 4:
		return fmt.Errorf("harness: Options.ZooKeeper with Kafka %d.%d: Kafka 4.0 removed ZooKeeper mode (KIP-833); leave it false (KRaft)", major, minor)
	case !o.ZooKeeper && (major < 3 || (major == 3 && minor < 3)):
		return fmt.Errorf("harness: Kafka %d.%d in KRaft mode: KRaft is production-ready from 3.3 (KIP-833); set Options.ZooKeeper", major, minor)
	case o.ZooKeeper && len(o.FormatArgs) > 0:
		return fmt.Errorf("harness: Options.FormatArgs with Options.ZooKeeper: there is no storage format in ZooKeeper mode; create SCRAM credentials with AlterUserScramCredentials once it runs")
	}
	return nil
}
