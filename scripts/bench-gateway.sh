#!/usr/bin/env bash
# Side-by-side benchmark of the gateway and nginx (not part of the test
# command): builds the bulkhead command from this checkout and the
# benchmark (benchmarks/gateway), then runs it with the flags given, such as
#
#   scripts/bench-gateway.sh -rounds 5 -dur 5s
#   scripts/bench-gateway.sh -phases latency -modes plain -perf /tmp/gw.perf
#   scripts/bench-gateway.sh -phases held -goproxy
#
# nginx comes from apt-get install nginx; without it the nginx floor is
# skipped. See benchmarks/gateway's package doc for what it measures.
set -euo pipefail
cd "$(dirname "$0")/.."
# The held phase opens thousands of connections at once: the load generator
# and each proxy need a descriptor per connection (nginx two per stream).
hard=$(ulimit -Hn)
if [ "$hard" = unlimited ] || [ "$hard" -gt 65536 ]; then
	hard=65536
fi
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$hard" ]; then
	ulimit -n "$hard"
fi
echo "open files: $(ulimit -n)"
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/bulkhead" ./cmd/bulkhead
go build -o "$bin/bench" ./benchmarks/gateway
"$bin/bench" -gateway "$bin/bulkhead" "$@"
