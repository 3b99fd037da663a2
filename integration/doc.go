// Package integration holds kmirror's end-to-end tests against real Apache
// Kafka brokers (assembled from Maven Central jars by the harness
// sub-package) and real kmirror daemon processes. Every test compares the
// source and destination clusters record by record.
package integration
