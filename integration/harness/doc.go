// Package harness runs real Apache Kafka clusters as local JVM processes
// for kmirror's integration tests, demo and benchmarks: in KRaft mode
// (Kafka 3.3 on), or in ZooKeeper mode for versions before 4.0
// (Options.ZooKeeper: one ZooKeeper JVM from the zookeeper jar the version
// depends on). Tested: 2.8.2 ZooKeeper, 3.9.1 ZooKeeper and KRaft, 4.x
// KRaft, all on Java 17.
//
// The Kafka jars come from Maven Central through
// integration/kafka/assemble.sh, which caches them per version under
// .cache/ (KMIRROR_CACHE); Libs runs it once per process. The version is
// Options.KafkaVersion, else KAFKA_VERSION, else the one pinned in that
// script; each cluster may run its own. The Java tool main classes
// (ConsoleProducer...) are 4.x's: older versions name some differently.
//
// A one-broker cluster is a single combined broker+controller node. A larger
// cluster is one controller-only node plus N broker-only nodes, so that any
// broker can be stopped or killed without losing the metadata quorum. Every
// node listens on free loopback ports that it keeps across restarts.
//
// JVMs run in their own process group with a parent-death signal, so a test
// binary that dies takes its brokers along; Close kills them all. Their
// output goes to Options.Log (default: kafka.log in the cluster folder) with
// a per-node prefix; KMIRROR_KAFKA_LOG_LEVEL (default WARN) sets the level.
//
// Linux only: it relies on Pdeathsig and process groups.
package harness
