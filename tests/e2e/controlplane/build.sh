#!/usr/bin/env bash
# Builds the control-plane binaries for the end-to-end tier into a per-user cache keyed by version.
# A second run with the same versions builds nothing. Usage: build.sh [--force] [--real-node]
# --real-node also builds what a real node of the local cluster runs: kubelet and kube-proxy (same
# module, same version) and a static pause binary for the pod sandbox image.
# Prints the cache directory on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
K8S_VERSION=v1.34.4
ETCD_VERSION=v3.6.4
KWOK_VERSION=v0.8.0
cache_root=${GPU_ADMISSION_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-admission}
bin="$cache_root/controlplane/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION"
force=
real_node=
for arg in "$@"; do
  case $arg in
    --force) force=--force ;;
    --real-node) real_node=yes ;;
    *) echo "build.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
mkdir -p "$bin"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34 -X k8s.io/component-base/version.gitTreeState=clean"
build() {  # name package [ldflags]
  local name=$1 pkg=$2 flags=${3:-"-s -w"}
  if [[ -x "$bin/$name" && "$force" != --force ]]; then return; fi
  echo "building $name ($pkg)" >&2
  local start=$SECONDS
  (cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags "$flags" -o "$bin/$name.tmp" "$pkg")
  mv "$bin/$name.tmp" "$bin/$name"
  echo "built $name in $((SECONDS - start))s" >&2
}
build etcd go.etcd.io/etcd/server/v3
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$ldflags"
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$ldflags"
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$ldflags"
build kubectl k8s.io/kubernetes/cmd/kubectl "$ldflags"
if [[ -n "$real_node" ]]; then
  build kubelet k8s.io/kubernetes/cmd/kubelet "$ldflags"
  build kube-proxy k8s.io/kubernetes/cmd/kube-proxy "$ldflags"
  build pause ./pause
fi
if [[ ! -x "$bin/kwok" || "$force" == --force ]]; then
  # kwok has no replace lines and needs newer k8s.io modules than the tools module pins, so it is
  # installed on its own rather than from the tools module.
  echo "building kwok" >&2
  start=$SECONDS
  tmp=$(mktemp -d)
  (cd "$tmp" && CGO_ENABLED=0 GOBIN="$tmp" GOFLAGS=-trimpath go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION")
  mv "$tmp/kwok" "$bin/kwok"; rm -rf "$tmp"
  echo "built kwok in $((SECONDS - start))s" >&2
fi
if [[ ! -s "$bin/kwok-stages.yaml" || "$force" == --force ]]; then
  # kwok >= v0.8.0 ships no built-in stages: take the "fast" node and pod stages from its module.
  moddir=$(cd "$(mktemp -d)" && GOFLAGS= go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  stage="$moddir/kustomize/stage"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo "---"; cat "$stage/$f"
  done > "$bin/kwok-stages.yaml.tmp"
  mv "$bin/kwok-stages.yaml.tmp" "$bin/kwok-stages.yaml"
fi
echo "$bin"
