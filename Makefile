# kmirror — see README.md.
#
#   make build   the kmirror binary into bin/
#   make test    unit tests and the Prometheus rules' tests, then the real-Kafka integration tests
#   make test-rules  promtool check and test of deploy/prometheus (Debian: apt-get install prometheus)
#   make demo    source + destination Kafka and a kmirror member, mirroring a demo topic
#                (runs DEMO_SECONDS, default 60, after the backlog is mirrored; Ctrl-C stops)
#   make bench   throughput and latency of a 3-member group against the Kafka Java
#                producer baseline, then the control plane at 100,000 partitions
#   make fuzz    each fuzz target for FUZZTIME (default 30s); the seed corpus is in testdata/fuzz
#   make dist    a release tarball and a Debian package (with the systemd unit) into dist/
#   make kafka   assemble Apache Kafka from Maven Central (KAFKA_VERSION=... to override)
#   make clean   remove build outputs and the Kafka cache

GO ?= go
BIN := bin/kmirror

.PHONY: build test test-unit test-rules demo bench fuzz dist clean

build:
	$(GO) build -o $(BIN) ./cmd/kmirror

test-unit:
	$(GO) vet ./...
	$(GO) test -count=1 -race ./cmd/... ./daemon/... ./raftstore/... ./fetch/... ./truncate/...

# The alerting rules operators load (deploy/prometheus): checked and
# unit-tested with promtool against series that must and must not fire.
test-rules:
	promtool check rules deploy/prometheus/kmirror-rules.yml
	promtool test rules deploy/prometheus/kmirror-rules.test.yml

test: test-unit test-rules test-integration

# Prints figures, asserts none: BENCH_FLAGS="--bytes 64MiB --latency-seconds 5"
# for a short run (see go run ./integration/bench --help).
BENCH_FLAGS ?=

bench: build kafka
	KAFKA_VERSION='$(KAFKA_VERSION)' $(GO) run ./integration/bench --kmirror $(BIN) $(BENCH_FLAGS)
	$(GO) test ./daemon -run '^$$' -bench ControlPlane -benchtime 1x

FUZZTIME ?= 30s

fuzz:
	$(GO) test ./fetch/kafka/ksec -run '^$$' -fuzz '^FuzzParseProperties$$' -fuzztime $(FUZZTIME)
	$(GO) test ./fetch/kafka/ksec -run '^$$' -fuzz '^FuzzSecuritySettings$$' -fuzztime $(FUZZTIME)
	$(GO) test ./daemon/config -run '^$$' -fuzz '^FuzzParseConfig$$' -fuzztime $(FUZZTIME)
	$(GO) test ./daemon -run '^$$' -fuzz '^FuzzHTTPRequests$$' -fuzztime $(FUZZTIME)

# Built, not `go run`: go run exits 1 after a Ctrl-C even when the demo
# shut down cleanly and exited 0.
demo: build kafka
	$(GO) build -o bin/kmirror-demo ./integration/demo
	KAFKA_VERSION='$(KAFKA_VERSION)' bin/kmirror-demo --kmirror $(BIN)

# Release artifacts: dist/kmirror_$(VERSION)_amd64.deb (built by nfpm,
# github.com/goreleaser/nfpm, pinned here; go run fetches it through the
# module proxy, checksums from go.sum's database) and
# dist/kmirror-$(VERSION)-linux-amd64.tar.gz. The packaged unit runs
# /usr/bin/kmirror; deploy/kmirror.service (a manual install) runs
# /usr/local/bin/kmirror.
VERSION ?= 0.1.0+git.$(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
NFPM ?= $(GO) run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.48.0
TARBALL := kmirror-$(VERSION)-linux-amd64

dist:
	rm -rf dist && mkdir -p dist/root dist/$(TARBALL)
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -ldflags '-s -w -X main.version=$(VERSION)' -o dist/root/kmirror ./cmd/kmirror
	sed 's|/usr/local/bin/kmirror|/usr/bin/kmirror|g; s|^# /etc/systemd/system/kmirror.service.*|# (installed by the kmirror package)|' \
		deploy/kmirror.service > dist/root/kmirror.service
	VERSION='$(VERSION)' $(NFPM) package --config deploy/dist/nfpm.yaml --packager deb --target dist/
	cp dist/root/kmirror deploy/kmirror.service deploy/kmirror.example.yaml deploy/dist/sysusers.conf deploy/dist/tmpfiles.conf \
		deploy/prometheus/kmirror-rules.yml README.md dist/$(TARBALL)/
	cp deploy/README.md dist/$(TARBALL)/deploy.md
	tar -C dist -czf dist/$(TARBALL).tar.gz $(TARBALL)
	rm -rf dist/root dist/$(TARBALL)
	ls -l dist

clean:
	rm -rf bin .cache dist

include integration/kafka/kafka.mk
