#!/usr/bin/env bash
# The project's test command: installs what the tests need on a fresh machine
# (redis-server, for the pacer's Redis backend), then checks formatting, vets,
# runs staticcheck and runs every test under the race detector.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  echo "test.sh: installing redis-server" >&2
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "test.sh: gofmt needed on:" >&2
  echo "$unformatted" >&2
  exit 1
fi
go vet ./...
GOOS=windows go vet ./... # the library and the command build beyond Unix
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
go test -race -count=1 -timeout 20m ./...

# The official SDKs are tested in a module of their own (sdktest), so they
# never enter the module graph of the bulkhead's users.
(
  cd sdktest
  go vet ./...
  go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
  go test -race -count=1 -timeout 10m ./...
)

# The gateway's traces against a real Jaeger, a tool of a module of its own
# (jaegertest): Jaeger and the OpenTelemetry it needs stay out of the
# bulkhead's module graph. The first run builds Jaeger (minutes); the build
# cache keeps it for the next.
(
  cd jaegertest
  go vet ./...
  go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
  go test -race -count=1 -timeout 20m ./...
)
