#!/usr/bin/env bash
# Builds one of the real programs the tests and the demo run beside the operators, once, from Go
# modules, into a cache outside the repository, and prints the binary's path:
#   metallb   MetalLB's controller (assigns LoadBalancer addresses from IPAddressPools)
#   jaeger    Jaeger v2 (OTLP in on 4318, query API on 16686, in-memory storage)
#   promtool  Prometheus' rule checker and rule unit-tester
#   helm      Helm 3 (lint, template, install of charts/)
# Each is pinned by hack/tools/<name>/go.mod (a `tool` directive); the cache directory is keyed by a
# hash of its go.mod and go.sum, so a new pin builds anew and an unchanged one costs one hash.
set -euo pipefail
name=${1:?usage: hack/build-tool.sh metallb|jaeger|promtool|helm}
src=$(cd "$(dirname "$0")/tools/$name" && pwd)
pkg=$(awk '$1 == "tool" { print $2; exit }' "$src/go.mod")
key=$(cat "$src/go.mod" "$src/go.sum" | sha256sum | cut -c1-16)
cache=${COZY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cozystack-operators}
dir=$cache/$name-$key
bin=$dir/$(basename "$pkg")
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
command -v go >/dev/null || { echo "go is required to build $name" >&2; exit 1; }
mkdir -p "$cache"
tmp=$(mktemp -d "$dir.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
started=$(date +%s)
echo "building $name ($pkg) into $dir; the first build takes a while..." >&2
(cd "$src" && go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$tmp/" "$pkg") >&2
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "built $name in $(( $(date +%s) - started ))s" >&2
echo "$bin"
