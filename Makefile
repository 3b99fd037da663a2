# kmirror — see README.md.
#
#   make build   the kmirror binary into bin/
#   make test    unit tests, then the real-Kafka integration tests
#   make demo    source + destination Kafka and a kmirror member, mirroring a demo topic
#   make bench   throughput and latency against the Kafka Java producer baseline
#   make kafka   assemble Apache Kafka from Maven Central (KAFKA_VERSION=... to override)
#   make clean   remove build outputs and the Kafka cache

GO ?= go
BIN := bin/kmirror

.PHONY: build test test-unit demo bench clean

build:
	$(GO) build -o $(BIN) ./cmd/kmirror

test-unit:
	$(GO) vet ./...
	$(GO) test -count=1 -race ./cmd/... ./daemon/... ./raftstore/... ./fetch/... ./truncate/...

test: test-unit test-integration

clean:
	rm -rf bin .cache

include integration/kafka/kafka.mk
