#!/usr/bin/env bash
# Builds the local control plane once, from Go modules, into a cache outside the repository, and
# prints the directory that holds the binaries:
#   kube-apiserver, kube-controller-manager, kubectl   the pinned Kubernetes release (hack/controlplane/go.mod)
#   devcluster                                         the launcher, with etcd embedded (cmd/devcluster)
# The directory is keyed by a hash of go.mod, go.sum and the launcher's source, so a change to the
# pinned release or the launcher builds anew; an unchanged tree costs one hash.
set -euo pipefail
src=$(cd "$(dirname "$0")/controlplane" && pwd)
release=$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$src/go.mod")
minor=$(echo "$release" | cut -d. -f2)
key=$(cat "$src/go.mod" "$src/go.sum" "$src"/cmd/devcluster/*.go | sha256sum | cut -c1-16)
cache=${COZY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cozystack-operators}
bin=$cache/controlplane-$release-$key
if [ -x "$bin/devcluster" ]; then
  echo "$bin"
  exit 0
fi
command -v go >/dev/null || { echo "go is required to build the local control plane" >&2; exit 1; }
# Stamp the release into the binaries, as Kubernetes' own build does, so /version and
# `kubectl version` tell the truth instead of v0.0.0.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags="$ldflags -X $pkg.gitVersion=$release -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
tmp=$(mktemp -d "$cache.build.XXXXXX" 2>/dev/null || { mkdir -p "$cache" && mktemp -d "$cache.build.XXXXXX"; })
trap 'rm -rf "$tmp"' EXIT
started=$(date +%s)
echo "building the local control plane ($release) into $bin; the first build takes a while..." >&2
(cd "$src" && go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kubectl \
  ./cmd/devcluster) >&2
mkdir -p "$(dirname "$bin")"
rm -rf "$bin"
mv "$tmp" "$bin"
trap - EXIT
echo "built in $(( $(date +%s) - started ))s" >&2
echo "$bin"
