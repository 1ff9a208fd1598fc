#!/usr/bin/env bash
# What a retry budget buys under overload (not part of the test suite):
# clients that retry as the official SDKs do, against gateways with and
# without a retry budget, on loopback. It builds the benchmark
# (benchmarks/retries) and runs it with the flags given, such as
#
#   scripts/bench-retries.sh -dur 60s -warmup 10s -factors 2,4
#
# See benchmarks/retries's package doc for what it measures.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/bench" ./benchmarks/retries
"$bin/bench" "$@"
