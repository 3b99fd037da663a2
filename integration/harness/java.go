package harness

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Main classes of Kafka's Java command-line tools (the kafka-tools jar),
// for Cluster.Java. Checked against Kafka 4.1.1.
const (
	ConsoleProducer      = "org.apache.kafka.tools.ConsoleProducer"
	ConsoleConsumer      = "org.apache.kafka.tools.consumer.ConsoleConsumer"
	ProducerPerformance  = "org.apache.kafka.tools.ProducerPerformance"
	ConsumerPerformance  = "org.apache.kafka.tools.ConsumerPerformance"
	EndToEndLatency      = "org.apache.kafka.tools.EndToEndLatency"
	VerifiableProducer   = "org.apache.kafka.tools.VerifiableProducer"
	VerifiableConsumer   = "org.apache.kafka.tools.VerifiableConsumer"
	ConsumerGroupCommand = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
	TopicCommand         = "org.apache.kafka.tools.TopicCommand"
	GetOffsetShell       = "org.apache.kafka.tools.GetOffsetShell"
)

// Broker-side main classes (the kafka_2.13 jar).
const (
	kafkaMain   = "kafka.Kafka"
	storageTool = "kafka.tools.StorageTool"
)

const killWaitDelay = 5 * time.Second

// jvmArgs returns the java arguments up to (excluding) the main class: heap,
// small-machine GC and logging settings, and the classpath.
func jvmArgs(home string, extraClasspath []string, throughput bool, heap ...string) []string {
	args := append(append([]string{}, heap...),
		"-XX:+UseSerialGC",
		"-XX:-UsePerfData",
		"-XX:+ExitOnOutOfMemoryError",
		"-Djava.awt.headless=true",
	)
	if !throughput {
		// C1 only: about twice as fast to start, much slower at steady state.
		args = append(args, "-XX:TieredStopAtLevel=1")
	}
	args = append(args, "-Dlog4j2.configurationFile="+filepath.Join(home, "log4j2.properties"))
	args = append(args, "-Dkmirror.kafka.log.level="+logLevel())
	return append(args, "-cp", strings.Join(append([]string{filepath.Join(home, "libs", "*")}, extraClasspath...), string(filepath.ListSeparator)))
}

// childAttr puts a JVM in its own process group (so the whole group can be
// killed) and kills it when the thread that started it dies, which in Go
// means when the test or demo process dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

func killGroup(pid int) {
	_ = syscall.Kill(-pid, syscall.SIGKILL)
}

// Java returns a command running a Kafka Java tool (e.g. ConsoleProducer)
// with the cluster's classpath, logging config and small-heap JVM flags.
// Cancelling ctx kills the tool's process group; the caller starts and
// waits for the command. Point the tool at the cluster with Bootstrap().
func (c *Cluster) Java(ctx context.Context, mainClass string, args ...string) *exec.Cmd {
	return c.JavaHeap(ctx, "512m", mainClass, args...)
}

// JavaHeap is Java with a maximum heap of maxHeap (a -Xmx value such as
// "2g"), for tools whose own launch script gives them more than the
// command-line tools' 512m (connect-mirror-maker.sh: 2G).
func (c *Cluster) JavaHeap(ctx context.Context, maxHeap, mainClass string, args ...string) *exec.Cmd {
	argv := append(jvmArgs(c.home, nil, c.throughput, "-Xms64m", "-Xmx"+maxHeap), mainClass)
	cmd := exec.CommandContext(ctx, c.java, append(argv, args...)...)
	cmd.SysProcAttr = childAttr()
	cmd.Cancel = func() error {
		killGroup(cmd.Process.Pid)
		return nil
	}
	cmd.WaitDelay = killWaitDelay
	return cmd
}

// logLevel is the JVMs' log4j root level: KMIRROR_KAFKA_LOG_LEVEL or WARN.
func logLevel() string {
	if level := os.Getenv("KMIRROR_KAFKA_LOG_LEVEL"); level != "" {
		return level
	}
	return "WARN"
}
