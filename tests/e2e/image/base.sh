#!/usr/bin/env bash
# Makes the Debian base image that the gpu-admission image is built on (build.sh) and that CI's
# fresh-machine tier runs the README's commands in (.ci/run fresh), so that no container registry
# is needed: Debian (debootstrap, minbase) with python3 and python3-venv, imported with
# `docker import`. Its tarball is cached per user, keyed by suite and package list, beside the
# control-plane binaries: only the first run pays for debootstrap.
#
# Usage: base.sh. Needs root (debootstrap) and a running dockerd. Prints the image's name on its
# last line.
set -euo pipefail
SUITE=bookworm
MIRROR=${GPU_ADMISSION_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=python3,python3-venv
BASE_REVISION=1  # bump when the trimming below changes
key="debian-$SUITE-$(echo "$PACKAGES" | tr ',' '-')-r$BASE_REVISION"
cache_root=${GPU_ADMISSION_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-admission}
cache="$cache_root/images"
base="gpu-admission-base:$key"

mkdir -p "$cache"
if ! docker image inspect "$base" >/dev/null 2>&1; then
  if [[ ! -s "$cache/$key.tar" ]]; then
    command -v debootstrap >/dev/null || { echo "base.sh: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
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
echo "$base"
