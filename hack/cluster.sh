#!/usr/bin/env bash
# make cluster / make cluster-down: the local control plane in the background, state in .devcluster/.
#   hack/cluster.sh up     build if needed, start, wait until ready, print how to use it
#   hack/cluster.sh down   stop it and everything it started
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
state=$root/.devcluster
case "${1:-}" in
up)
  if [ -f "$state/pid" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null; then
    echo "already running: export KUBECONFIG=$state/kubeconfig"
    exit 0
  fi
  bin=$("$root/hack/build-controlplane.sh")
  mkdir -p "$state/bin"
  ln -sf "$bin/kubectl" "$state/bin/kubectl"
  rm -f "$state/ready"
  nohup "$bin/devcluster" -dir "$state" >"$state/devcluster.log" 2>&1 </dev/null &
  echo $! >"$state/pid"
  deadline=$(( $(date +%s) + 90 ))
  until [ -f "$state/ready" ]; do
    if ! kill -0 "$(cat "$state/pid")" 2>/dev/null; then
      echo "the control plane did not start:" >&2; tail -20 "$state/devcluster.log" >&2; exit 1
    fi
    [ "$(date +%s)" -lt "$deadline" ] || { echo "not ready within 90s; see $state/logs/" >&2; exit 1; }
    sleep 0.2
  done
  echo "local control plane ready ($(cat "$state/ready"))"
  echo "  export KUBECONFIG=$state/kubeconfig PATH=$state/bin:\$PATH   # then: kubectl get ns"
  ;;
down)
  if [ -f "$state/pid" ]; then
    pid=$(cat "$state/pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$state/pid" "$state/ready"
    echo "local control plane stopped"
  else
    echo "no local control plane running"
  fi
  ;;
*) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
