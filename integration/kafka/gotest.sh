#!/usr/bin/env bash
# Runs `go test "$@"` with its whole output kept in $GOTEST_LOG (default
# .cache/test-integration.log) and, when it fails, prints a digest last:
# the tests running at a timeout and every "--- FAIL" with the lines under
# it. A CI page often shows only the tail of the output, and the tail of a
# timeout is goroutine stacks, not the name of the test that hung.
set -uo pipefail
log="${GOTEST_LOG:-.cache/test-integration.log}"
mkdir -p "$(dirname "$log")"
go test "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
if [[ $status -ne 0 ]]; then
	echo
	echo "== go test failed (exit $status); digest of $log:"
	# The timeout panic's header up to its first blank line: the running tests.
	awk '/^panic: test timed out/{on=1} on&&/^$/{exit} on' "$log" | head -40
	grep -E -A 6 -e '--- FAIL' "$log" | head -120
	grep -E '^(FAIL|ok)[[:space:]]' "$log"
fi
exit "$status"
