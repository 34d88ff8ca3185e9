#!/usr/bin/env bash
# Builds the operators' image on this machine and prints its local tag
# (localhost/cozystack-operators:<hash of the build context>). No image registry is needed:
#   1. the bases: Debian bookworm from Debian's own packages (debootstrap --variant=minbase with
#      python3, python3-venv, python-is-python3, ca-certificates, netbase, tzdata), imported as the
#      local image localhost/cozystack-python-builder:<hash of this recipe>, and the same tree
#      without venv, pip's wheels, apt and locales as localhost/cozystack-python-base:<hash>; built
#      once, then reused;
#   2. the Dockerfile, built by buildah (chroot isolation: crun and the OCI isolation refuse a
#      hybrid-cgroup host) with BUILDER_IMAGE and PYTHON_IMAGE set to those bases.
# pip in the builder stage trusts the host's CA bundle (some networks re-sign TLS): the bundle is
# mounted for the build's RUN steps only and named by PIP_CERT; it is never copied into the image.
# Where a registry is reachable, `podman build .` with the Dockerfile's default base works as well.
#   COZY_IMAGE_BASE=<image>  build on that base instead of the Debian one (e.g. python:3.11-slim-bookworm)
#   COZY_IMAGE_TAG=<tag>     tag the result so instead of the content hash
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
for tool in buildah podman debootstrap; do
  command -v "$tool" >/dev/null || {
    echo "$tool is required: apt-get install podman buildah runc debootstrap (see .ci/run)" >&2
    exit 1
  }
done
suite=bookworm
mirror=${COZY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=python3,python3-venv,python-is-python3,ca-certificates,netbase,tzdata
# What only the builder stage needs (python -m venv and the pip wheel it bootstraps); the run-time
# base is the same tree without them, nor apt, locales and documentation.
build_only="python3-venv python3.11-venv python3-pip-whl python3-setuptools-whl python3-distutils python3-lib2to3 apt"
base_key=$(printf '%s\n' "$suite" "$packages" "$build_only" | cat - "$0" | sha256sum | cut -c1-12)
builder_base=${COZY_IMAGE_BASE:-localhost/cozystack-python-builder:$base_key}
base=${COZY_IMAGE_BASE:-localhost/cozystack-python-base:$base_key}
import_rootfs() { # <rootfs> <image>
  tar -C "$1" --numeric-owner -c . | podman import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' - "$2" >&2
}
if [ -z "${COZY_IMAGE_BASE:-}" ] && ! { podman image exists "$base" && podman image exists "$builder_base"; }; then
  started=$(date +%s)
  echo "building the bases $builder_base and $base from Debian $suite (debootstrap)..." >&2
  rootfs=$(mktemp -d /var/tmp/cozystack-base.XXXXXX)
  trap 'rm -rf "$rootfs"' EXIT
  debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >&2
  # A base image carries no package lists, caches, logs or documentation.
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/log/* \
    "$rootfs"/usr/share/doc "$rootfs"/usr/share/man "$rootfs"/usr/share/info
  import_rootfs "$rootfs" "$builder_base"
  # shellcheck disable=SC2086 # the list is word-split on purpose
  chroot "$rootfs" dpkg --purge $build_only >&2
  rm -rf "$rootfs"/usr/share/locale/* "$rootfs"/var/cache/* "$rootfs"/var/log/* "$rootfs"/var/lib/apt
  import_rootfs "$rootfs" "$base"
  rm -rf "$rootfs"
  trap - EXIT
  echo "built the bases in $(( $(date +%s) - started ))s" >&2
fi
# The tag is the content of what the Dockerfile copies, plus the Dockerfile and the base: the same
# tree builds (and finds) the same tag.
context_key=$(cd "$root" && { cat Dockerfile .dockerignore pyproject.toml requirements.lock README.md
  git ls-files -co --exclude-standard shared operators | LC_ALL=C sort | xargs cat; echo "$base"; } | sha256sum | cut -c1-12)
tag=${COZY_IMAGE_TAG:-localhost/cozystack-operators:$context_key}
if ! podman image exists "$tag"; then
  started=$(date +%s)
  ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
  mounts=()
  build_args=(--build-arg "PYTHON_IMAGE=$base" --build-arg "BUILDER_IMAGE=$builder_base")
  if [ -r "$ca" ]; then
    mounts=(--volume "$ca:/run/host-ca.crt:ro")
    build_args+=(--build-arg PIP_CERT=/run/host-ca.crt)
  fi
  echo "building $tag on $base..." >&2
  buildah build --isolation chroot --network host --layers \
    "${mounts[@]}" "${build_args[@]}" --tag "$tag" "$root" >&2
  echo "built the image in $(( $(date +%s) - started ))s" >&2
fi
echo "$tag"
