#!/usr/bin/env bash
# Builds the ecosystem tools the chart and monitoring tests call, helm and promtool, from the Go
# module proxy into the same per-user cache as the control plane, keyed by version. A second run
# with the same versions builds nothing. Usage: build.sh [--force] [helm|promtool ...]
# (no name: both). Prints the cache directory on its last line.
# Each is built on its own, as kwok is (helm: `go install module/cmd@version`; promtool: inside its
# downloaded module): neither belongs in the control-plane tools module, whose k8s.io pins they do
# not share.
set -euo pipefail
HELM_VERSION=v3.19.0
PROMETHEUS_VERSION=v0.313.5  # the Go module version of Prometheus 3.13.5's promtool
cache_root=${GPU_ADMISSION_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-admission}
bin="$cache_root/ecosystem/helm-$HELM_VERSION-prometheus-$PROMETHEUS_VERSION"
force=
names=()
for arg in "$@"; do
  case $arg in
    --force) force=--force ;;
    helm|promtool) names+=("$arg") ;;
    *) echo "build.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
[[ ${#names[@]} -gt 0 ]] || names=(helm promtool)
mkdir -p "$bin"
install() {  # name package@version
  local name=$1 pkg=$2
  if [[ -x "$bin/$name" && "$force" != --force ]]; then return; fi
  echo "building $name ($pkg)" >&2
  local start=$SECONDS tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && CGO_ENABLED=0 GOBIN="$tmp" GOFLAGS=-trimpath go install -ldflags "-s -w" "$pkg")
  mv "$tmp/$name" "$bin/$name"; rm -rf "$tmp"
  echo "built $name in $((SECONDS - start))s" >&2
}
for name in "${names[@]}"; do
  case $name in
    helm) install helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" ;;
    promtool)
      # Prometheus' go.mod has replace directives, which `go install pkg@version` refuses: build
      # inside the downloaded module, with its own go.mod and go.sum.
      if [[ ! -x "$bin/promtool" || "$force" == --force ]]; then
        echo "building promtool (github.com/prometheus/prometheus@$PROMETHEUS_VERSION)" >&2
        start=$SECONDS
        moddir=$(cd "$(mktemp -d)" && GOFLAGS= go mod download -json "github.com/prometheus/prometheus@$PROMETHEUS_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
        (cd "$moddir" && GOWORK=off CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false" go build -ldflags "-s -w" -o "$bin/promtool.tmp" ./cmd/promtool)
        mv "$bin/promtool.tmp" "$bin/promtool"
        echo "built promtool in $((SECONDS - start))s" >&2
      fi
      ;;
  esac
done
echo "$bin"
