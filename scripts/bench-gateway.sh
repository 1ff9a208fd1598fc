#!/usr/bin/env bash
# Side-by-side benchmark of the gateway and nginx (not part of the test
# command): builds the bulkhead command from this checkout and the
# benchmark (benchmarks/gateway), then runs it with the flags given, such as
#
#   scripts/bench-gateway.sh -rounds 5 -dur 5s
#   scripts/bench-gateway.sh -phases latency -modes plain -perf /tmp/gw.perf
#
# nginx comes from apt-get install nginx; without it the nginx floor is
# skipped. See benchmarks/gateway's package doc for what it measures.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/bulkhead" ./cmd/bulkhead
go build -o "$bin/bench" ./benchmarks/gateway
"$bin/bench" -gateway "$bin/bulkhead" "$@"
