#!/usr/bin/env bash
# Assembles Apache Kafka (broker, storage tool, Java command-line tools and a
# log4j2 backend) from Maven Central into a version-keyed cache folder, for
# the real-Kafka tests (integration/harness), the demo and the benchmarks.
#
#   KAFKA_VERSION  Kafka version to assemble (default below: the one pin)
#   KMIRROR_CACHE  cache folder (default <repo>/.cache, git-ignored)
#
# Prints the Kafka home folder (holding libs/ and log4j2.properties) as the
# only line on stdout; progress and errors go to stderr. Safe to run in
# parallel: a file lock serialises assembly and the result appears at once
# (assembled in a temporary folder, then renamed).
set -euo pipefail

VERSION="${KAFKA_VERSION:-4.1.1}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${KMIRROR_CACHE:-$repo/.cache}"
home="$cache/kafka-$VERSION"
marker="$home/ASSEMBLED"

say() { echo "assemble.sh: $*" >&2; }
die() { say "error: $*"; exit 1; }

command -v java >/dev/null 2>&1 ||
	die "java not found: install a JDK 17, e.g. apt-get install -y openjdk-17-jre-headless"

# The marker records what the folder was built from, so a changed pom or
# logging config triggers a rebuild instead of serving stale jars.
stamp="version=$VERSION inputs=$(cat "$here/pom.xml" "$here/log4j2.properties" | sha256sum | cut -d' ' -f1)"

assembled() { [[ -f "$marker" && "$(cat "$marker")" == "$stamp" ]]; }

if assembled; then
	echo "$home"
	exit 0
fi

mkdir -p "$cache"
if command -v flock >/dev/null 2>&1; then
	exec 9>"$cache/kafka-$VERSION.lock"
	flock 9
	# Another process may have finished while we waited for the lock.
	if assembled; then
		echo "$home"
		exit 0
	fi
fi

command -v mvn >/dev/null 2>&1 ||
	die "mvn not found: install Maven, e.g. apt-get install -y maven"

tmp="$(mktemp -d "$cache/.kafka-$VERSION.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

copy_deps() {
	mvn -B -q -Dstyle.color=never "$@" -f "$here/pom.xml" dependency:copy-dependencies \
		-DincludeScope=runtime \
		-Dkafka.version="$VERSION" \
		-DoutputDirectory="$tmp/libs" >"$tmp/mvn.log" 2>&1
}

local_repo="${MAVEN_REPO_LOCAL:-$HOME/.m2/repository}"
say "assembling Kafka $VERSION into $home"
ok=false
# Offline first when Maven's local repository already has this version:
# no network needed to rebuild a wiped cache.
if [[ -f "$local_repo/org/apache/kafka/kafka_2.13/$VERSION/kafka_2.13-$VERSION.pom" ]] &&
	copy_deps -o; then
	ok=true
elif rm -rf "$tmp/libs" && copy_deps; then
	ok=true
elif grep -q "connect-mirror:jar:$VERSION" "$tmp/mvn.log" && rm -rf "$tmp/libs" && copy_deps -DskipMirrorMaker; then
	# Maven Central lacks connect-mirror for this release (4.4.0): the
	# broker and tools are enough for everything but make bench's
	# MirrorMaker 2 runs (--skip-mm2).
	say "Kafka $VERSION: no connect-mirror jar on Maven Central; assembled without MirrorMaker 2"
	ok=true
fi
if ! $ok; then
	tail -n 40 "$tmp/mvn.log" >&2
	die "Maven could not resolve Kafka $VERSION (coordinates: org.apache.kafka:kafka_2.13:$VERSION, org.apache.kafka:kafka-tools:$VERSION, plus log4j-core and log4j-slf4j-impl from $here/pom.xml).
  Check the version exists: mvn dependency:get -Dartifact=org.apache.kafka:kafka_2.13:$VERSION:pom
  or pick another one: KAFKA_VERSION=<4.x> $0"
fi

for jar in "kafka_2.13-$VERSION.jar" "kafka-tools-$VERSION.jar"; do
	[[ -f "$tmp/libs/$jar" ]] || die "Maven finished but $jar is missing from $tmp/libs"
done

cp "$here/log4j2.properties" "$tmp/log4j2.properties"
rm -f "$tmp/mvn.log"
echo "$stamp" >"$tmp/ASSEMBLED"
chmod 755 "$tmp"
rm -rf "$home"
mv "$tmp" "$home"
trap - EXIT
say "done: $(ls "$home/libs" | wc -l) jars"
echo "$home"
