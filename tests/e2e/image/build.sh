#!/usr/bin/env bash
# Builds the gpu-admission image the way users build it (`docker build` of the repository's
# Dockerfile), on a base image made here, so that no container registry is needed:
#
#   1. the base: Debian (debootstrap, minbase) with python3 and python3-venv, imported with
#      `docker import`. Its tarball is cached per user, keyed by suite and package list, beside the
#      control-plane binaries: only the first run pays for debootstrap.
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
SUITE=bookworm
MIRROR=${GPU_ADMISSION_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=python3,python3-venv
BASE_REVISION=1  # bump when the trimming below changes
key="debian-$SUITE-$(echo "$PACKAGES" | tr ',' '-')-r$BASE_REVISION"
cache_root=${GPU_ADMISSION_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-admission}
cache="$cache_root/images"
base="gpu-admission-base:$key"
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

mkdir -p "$cache"
if ! docker image inspect "$base" >/dev/null 2>&1; then
  if [[ ! -s "$cache/$key.tar" ]]; then
    command -v debootstrap >/dev/null || { echo "build.sh: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
    echo "making the base $base with debootstrap" >&2
    start=$SECONDS
    root=$(mktemp -d "$cache/.root.XXXXXX")
    trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >&2
    # What a container never uses: package caches and lists, documentation, man pages, locales.
    rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
           "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* "$root"/var/log/*
    tar -C "$root" --numeric-owner -cf "$cache/$key.tar.tmp" .
    mv "$cache/$key.tar.tmp" "$cache/$key.tar"
    rm -rf "$root"; trap - EXIT
    echo "made the base in $((SECONDS - start))s" >&2
  fi
  docker import "$cache/$key.tar" "$base" >/dev/null
fi

secret=()
if [[ -n "$ca_bundle" ]]; then secret=(--secret "id=ca,src=$ca_bundle"); fi
start=$SECONDS
docker_build --network host --build-arg "BASE=$base" "${secret[@]}" -t "$tag" "$repo" >&2
echo "built $tag in $((SECONDS - start))s ($(docker image inspect -f '{{.Size}}' "$tag") bytes)" >&2
echo "$tag"
