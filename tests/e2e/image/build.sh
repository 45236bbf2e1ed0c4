#!/usr/bin/env bash
# Builds the gpu-admission image the way users build it (`docker build` of the repository's
# Dockerfile), on a base image made here, so that no container registry is needed:
#
#   1. the base: Debian (debootstrap, minbase) with python3 and python3-venv, imported with
#      `docker import` (base.sh beside this file). Its tarball is cached per user, keyed by suite
#      and package list, beside the control-plane binaries: only the first run pays for debootstrap.
#   2. the image: `docker build --build-arg BASE=<that base>`. pip inside the build reaches the
#      package index over the host network; this machine's CA bundle is handed to that one RUN
#      as a BuildKit secret (a tmpfs mount), never stored in a layer or in the image's history.
#
# Usage: build.sh [TAG]   (default gpu-admission:0.1.0). Needs root (debootstrap) and a running
# dockerd. Prints the tag on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
tag=${1:-gpu-admission:0.1.0}
ca_bundle=${GPU_ADMISSION_CA_BUNDLE:-}
if [[ -z "$ca_bundle" ]]; then
  for candidate in "${PIP_CERT:-}" "${SSL_CERT_FILE:-}" /etc/ssl/certs/ca-certificates.crt; do
    if [[ -n "$candidate" && -s "$candidate" ]]; then ca_bundle=$candidate; break; fi
  done
fi

# The legacy builder cannot mount secrets: take a docker CLI that speaks BuildKit (buildx, or a
# CLI of the daemon's own generation, which has it built in).
docker_build() {
  if docker buildx version >/dev/null 2>&1; then
    docker buildx build --load "$@"
  elif [[ -x /usr/bin/docker ]]; then
    DOCKER_BUILDKIT=1 /usr/bin/docker build "$@"
  else
    DOCKER_BUILDKIT=1 docker build "$@"
  fi
}

base=$(bash "$here/base.sh" | tail -n 1)

secret=()
if [[ -n "$ca_bundle" ]]; then secret=(--secret "id=ca,src=$ca_bundle"); fi
start=$SECONDS
docker_build --network host --build-arg "BASE=$base" "${secret[@]}" -t "$tag" "$repo" >&2
echo "built $tag in $((SECONDS - start))s ($(docker image inspect -f '{{.Size}}' "$tag") bytes)" >&2
echo "$tag"
