// Package kafka is kmirror's access to Kafka clusters, shared by the data
// path (package fetch) and the daemon: cluster metadata and pooled broker
// connections (Cluster), sequential reads of one partition (PartitionReader,
// the walks' reader), and the admin client (Admin: topics and configs,
// partitions, offsets, producer IDs, ACLs and read-only denials, consumer
// group offsets, record-level work). The wire protocol kmirror speaks itself
// is in kwire, the Java client's security properties in ksec.
//
// It decides nothing about mirroring: no checkpoints, no translation, no
// partition states; it must not import fetch, the daemon or raftstore.
// Errors name the cluster ("source cluster of mirror m1", "destination
// cluster") and wrap kwire.Error with the broker's error code.
package kafka
