#!/usr/bin/env bash
# Builds the test node's programs once, from Go modules, into a cache outside the repository, and
# prints the directory that holds them:
#   kubelet, kube-scheduler   the control plane's own Kubernetes release (hack/node/go.mod)
#   pause                     the pod sandbox's process (hack/node/cmd/pause)
# Keyed by a hash of hack/node (go.mod, go.sum, the pause source), apart from the control plane's
# key, so building the node never rebuilds the control plane; the Go build cache both share makes
# the first node build cost only what the control plane did not compile already.
set -euo pipefail
src=$(cd "$(dirname "$0")/node" && pwd)
release=$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$src/go.mod")
minor=$(echo "$release" | cut -d. -f2)
key=$(cat "$src/go.mod" "$src/go.sum" "$src"/cmd/pause/*.go | sha256sum | cut -c1-16)
cache=${COZY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cozystack-operators}
bin=$cache/node-$release-$key
if [ -x "$bin/kubelet" ] && [ -x "$bin/kube-scheduler" ] && [ -x "$bin/pause" ]; then
  echo "$bin"
  exit 0
fi
command -v go >/dev/null || { echo "go is required to build the test node" >&2; exit 1; }
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags="$ldflags -X $pkg.gitVersion=$release -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
mkdir -p "$cache"
tmp=$(mktemp -d "$bin.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
started=$(date +%s)
echo "building the test node ($release) into $bin; the first build takes a while..." >&2
(cd "$src" && go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler) >&2
(cd "$src" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$tmp/pause" ./cmd/pause) >&2
rm -rf "$bin"
mv "$tmp" "$bin"
trap - EXIT
echo "built the test node in $(( $(date +%s) - started ))s" >&2
echo "$bin"
