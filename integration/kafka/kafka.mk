# Real Apache Kafka for the integration tests, demo and benchmarks.
# Included by the top-level Makefile.
#
#   make kafka                     assemble the pinned Kafka version
#   make kafka KAFKA_VERSION=4.0.1 another version (also read from the env)
#   make test-integration          go test ./integration/... against real Kafka
#   make test-compat               only the tests of other Kafka versions (the
#                                  harness's and kmirror's across versions)
#
# KAFKA_VERSION empty means the version pinned in assemble.sh (its only pin).

KAFKA_MK_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
KAFKA_VERSION ?=
# JVM clusters need the cores: one package at a time, never cached results,
# and a timeout above go test's 10-minute default.
# 60m: well under CI's 90, with room for a machine twice as slow as ours
# (the suite takes about 15 minutes here).
INTEGRATION_TIMEOUT ?= 60m

.PHONY: kafka test-integration test-compat

kafka:
	KAFKA_VERSION='$(KAFKA_VERSION)' '$(KAFKA_MK_DIR)/assemble.sh'

test-integration: kafka
	KAFKA_VERSION='$(KAFKA_VERSION)' '$(KAFKA_MK_DIR)/gotest.sh' -count=1 -p 1 -timeout $(INTEGRATION_TIMEOUT) ./integration/...

# Source clusters of other Kafka versions (2.8.2 ZooKeeper, 3.9.1 KRaft and
# ZooKeeper, 4.4.0) mirrored into the default, 4.4.0 into 3.9.1 and into
# 4.4.0; the harness starting each version and mode. make test runs them
# too (each pair takes seconds).
test-compat: kafka
	KAFKA_VERSION='$(KAFKA_VERSION)' '$(KAFKA_MK_DIR)/gotest.sh' -count=1 -p 1 -timeout $(INTEGRATION_TIMEOUT) \
		-run 'TestMirrorFromKafka|TestOlderKafkaVersions|TestModeRefusals' ./integration/ ./integration/harness/
