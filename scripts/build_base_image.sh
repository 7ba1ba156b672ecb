#!/usr/bin/env bash
# Build a local Debian base image with Python 3 from Debian's packages (debootstrap), for hosts
# that cannot pull public images (python:3.11.x-slim, prom/prometheus):
#
#   bash scripts/build_base_image.sh [TAG]        # default TAG: specwatch-base:bookworm
#
# The image offers what exporter/Dockerfile and exporter/Dockerfile.cpu use of the official
# python:*-slim image: Debian with apt, ca-certificates and useradd, and `python` / `pip` on PATH
# (a virtual environment at /opt/python made from Debian's python3: 3.11 on bookworm, what the
# CPU build of vLLM needs; pip installs into it, console scripts land on PATH). Use it with
#   docker build --build-arg BASE_IMAGE=specwatch-base:bookworm -f exporter/Dockerfile .
#
# The host's locally added certificate authorities (/usr/local/share/ca-certificates) are added to
# the image's trust store (SPECWATCH_HOST_CA=0: not). An existing image of that tag is kept (pass
# --rebuild to replace it). Needs root (debootstrap, chroot), debootstrap and a running Docker
# engine (scripts/docker_engine.sh start); reaches only Debian's archive
# ($SPECWATCH_DEBIAN_MIRROR, default http://deb.debian.org/debian).
# Variables: SPECWATCH_DEBIAN_SUITE (default bookworm).
set -euo pipefail

rebuild=0
args=()
for a in "$@"; do
  case "$a" in
    --rebuild) rebuild=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "unknown option: $a" >&2; exit 2 ;;
    *) args+=("$a") ;;
  esac
done
suite="${SPECWATCH_DEBIAN_SUITE:-bookworm}"
tag="${args[0]:-specwatch-base:$suite}"
mirror="${SPECWATCH_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

log() { printf '[base-image] %s\n' "$*" >&2; }

if [ "$rebuild" = 0 ] && docker image inspect "$tag" >/dev/null 2>&1; then
  log "$tag exists (pass --rebuild to replace it)"
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "build_base_image.sh: needs root (debootstrap, chroot)" >&2; exit 3; }
command -v debootstrap >/dev/null 2>&1 || { echo "build_base_image.sh: debootstrap missing (bash scripts/docker_engine.sh start installs it)" >&2; exit 3; }

work="$(mktemp -d /var/tmp/specwatch-rootfs.XXXXXX)"
cleanup() { umount "$work/rootfs/proc" 2>/dev/null || true; rm -rf --one-file-system "$work"; }
trap cleanup EXIT
start=$SECONDS
log "debootstrap --variant=minbase $suite (mirror $mirror)"
debootstrap --variant=minbase \
  --include=ca-certificates,passwd,python3,python3-venv \
  "$suite" "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -n 20 "$work/debootstrap.log" >&2; echo "build_base_image.sh: debootstrap failed" >&2; exit 1; }

root="$work/rootfs"
# apt sources of a released suite: main, updates and security (as the official Debian images).
if [ "$suite" != sid ] && [ "$suite" != unstable ]; then
  cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb http://deb.debian.org/debian-security $suite-security main
EOF
fi
# Certificate authorities added locally on this host (/usr/local/share/ca-certificates, e.g. a
# TLS-inspecting proxy in front of the package registries) are trusted inside the image too, so pip
# and apt reach the registries the way the host does. Set SPECWATCH_HOST_CA=0 to leave them out.
if [ "${SPECWATCH_HOST_CA:-1}" != 0 ] && compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null 2>&1
  log "trusting the host's local CAs: $(cd /usr/local/share/ca-certificates && echo *.crt)"
fi
# The Python environment: Debian's python3 with pip, as a venv that is first on PATH.
chroot "$root" /usr/bin/python3 -m venv /opt/python
chroot "$root" /opt/python/bin/python -c 'import sys, ssl; print(sys.version.split()[0])' >"$work/pyver"
# Keep the image small: no package lists or downloaded .debs (Dockerfiles run apt-get update).
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/* "$root"/tmp/* "$root"/root/.cache
# Like the official images: a policy that stops package scripts from starting services.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"

old_id="$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)"
log "importing as $tag (python $(cat "$work/pyver"))"
tar --numeric-owner --xattrs -C "$root" -c . | docker import \
  --change 'ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'LABEL org.opencontainers.image.description="Debian '"$suite"' minbase + python3 venv (specwatch scripts/build_base_image.sh)"' \
  --change 'CMD ["python3"]' \
  - "$tag" >/dev/null
# the image this one replaces (--rebuild), unless images built on it still need it
if [ -n "$old_id" ] && [ "$old_id" != "$(docker image inspect --format '{{.Id}}' "$tag")" ]; then
  docker rmi "$old_id" >/dev/null 2>&1 || true
fi
log "built $tag in $((SECONDS - start)) s ($(docker image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}'))"
