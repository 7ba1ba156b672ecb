#!/usr/bin/env bash
# Make a local Docker engine with the Compose v2 plugin available on a Debian host (bookworm or
# newer), for the compose end-to-end test (tests/e2e/test_compose_e2e.py) and for trying the bundle.
#
#   bash scripts/docker_engine.sh start    # install what is missing, start dockerd if not running
#   bash scripts/docker_engine.sh status   # exit 0 when `docker info` and `docker compose` work
#   bash scripts/docker_engine.sh stop     # stop the dockerd this script started (its pid file)
#
# What "install" means (only what is missing, as root or with sudo):
#   - Debian's docker.io (dockerd, containerd, runc) and debootstrap (scripts/build_base_image.sh);
#   - the Compose v2 CLI plugin: Debian trixie's docker-compose package (2.26, a Go binary that
#     needs glibc >= 2.34) when this release has no Compose v2 (bookworm's docker-compose is 1.29).
#     It is fetched with apt from deb.debian.org using a private sources list and state directory
#     (the host's apt configuration is not changed) and unpacked to
#     /usr/local/lib/docker/cli-plugins/docker-compose; bookworm's docker-compose 1.29 stays.
# dockerd is started by hand (no systemd needed) with overlay2 storage, its log in
# $SPECWATCH_DOCKERD_LOG (default /var/log/specwatch-dockerd.log).
#
# Exit status: 0 ready; 3 the engine cannot be had here, with ONE line on stderr saying why
# (not root and no sudo, no overlay support, dockerd exited: its last log lines follow).
set -euo pipefail

log() { printf '[docker-engine] %s\n' "$*" >&2; }
die() { printf 'docker engine unavailable: %s\n' "$*" >&2; exit 3; }

DOCKERD_LOG="${SPECWATCH_DOCKERD_LOG:-/var/log/specwatch-dockerd.log}"
PIDFILE=/var/run/specwatch-dockerd.pid
PLUGIN_DIR=/usr/local/lib/docker/cli-plugins
COMPOSE_SUITE="${SPECWATCH_COMPOSE_SUITE:-trixie}"
START_TIMEOUT="${SPECWATCH_DOCKERD_START_TIMEOUT:-60}"

if [ "$(id -u)" = 0 ]; then SUDO=(); elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO=(sudo -n); else SUDO=(none); fi
as_root() {
  [ "${SUDO[0]:-}" = none ] && die "installing or starting the engine needs root (or password-less sudo)"
  "${SUDO[@]}" "$@"
}

engine_ok() { docker info >/dev/null 2>&1; }
compose_ok() { docker compose version >/dev/null 2>&1; }

install_packages() {
  local need=()
  command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
  command -v docker >/dev/null 2>&1 || need+=(docker.io)
  command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
  [ ${#need[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null 2>&1 || die "no apt-get: install Docker Engine and debootstrap by hand"
  log "installing Debian packages: ${need[*]}"
  as_root apt-get update -qq
  # Debian's policy-rc.d (if any) keeps the package from starting the service; we start dockerd below.
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
    || die "apt-get install ${need[*]} failed"
}

install_compose_plugin() {
  compose_ok && return 0
  # This release's own docker-compose may already be v2 (trixie and newer).
  local ver
  ver="$(apt-cache policy docker-compose 2>/dev/null | awk '/Candidate:/ {print $2}')"
  if [ -n "$ver" ] && [ "${ver%%.*}" -ge 2 ] 2>/dev/null; then
    log "installing docker-compose $ver (Compose v2) from this release"
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends docker-compose >/dev/null \
      || die "apt-get install docker-compose failed"
    compose_ok && return 0
  fi
  log "fetching Compose v2 (docker-compose from Debian $COMPOSE_SUITE) with a private apt state"
  local d
  d="$(mktemp -d /tmp/specwatch-compose-apt.XXXXXX)"
  trap 'rm -rf "$d"' RETURN
  mkdir -p "$d/lists/partial" "$d/cache/archives/partial" "$d/x"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $COMPOSE_SUITE main" >"$d/sources.list"
  chmod -R a+rX "$d"
  local opts=(-o "Dir::Etc::SourceList=$d/sources.list" -o Dir::Etc::SourceParts=/dev/null
              -o "Dir::State::Lists=$d/lists" -o "Dir::Cache=$d/cache" -o APT::Sandbox::User=root)
  apt-get "${opts[@]}" update -qq >/dev/null 2>&1 || die "cannot read Debian $COMPOSE_SUITE's package index (deb.debian.org)"
  (cd "$d" && apt-get "${opts[@]}" download docker-compose >/dev/null 2>&1) || die "cannot download docker-compose from Debian $COMPOSE_SUITE"
  dpkg-deb -x "$d"/docker-compose_*.deb "$d/x"
  local bin="$d/x/usr/libexec/docker/cli-plugins/docker-compose"
  [ -x "$bin" ] || die "Debian $COMPOSE_SUITE's docker-compose package has no CLI plugin binary"
  "$bin" version >/dev/null 2>&1 || die "Debian $COMPOSE_SUITE's docker-compose does not run here (glibc too old?)"
  as_root install -D -m 755 "$bin" "$PLUGIN_DIR/docker-compose"
  compose_ok || die "docker compose still unavailable after installing $PLUGIN_DIR/docker-compose"
}

start_dockerd() {
  engine_ok && return 0
  if [ "${SUDO[0]:-}" = none ]; then
    local why
    why="$(docker info 2>&1 | grep -iE 'cannot|permission|error' | head -n 1 || true)"
    die "the engine does not answer (${why:-docker info failed}) and starting dockerd needs root (or password-less sudo)"
  fi
  grep -qw overlay /proc/filesystems 2>/dev/null || as_root modprobe overlay 2>/dev/null || true
  grep -qw overlay /proc/filesystems 2>/dev/null || die "the kernel has no overlay file system (overlay2 storage)"
  if [ -S /var/run/docker.sock ] && pgrep -x dockerd >/dev/null 2>&1; then
    log "dockerd runs but does not answer yet; waiting"
  else
    log "starting dockerd (log: $DOCKERD_LOG)"
    as_root sh -c "setsid dockerd --storage-driver=overlay2 --pidfile=/var/run/docker.pid >>'$DOCKERD_LOG' 2>&1 </dev/null & echo \$! >'$PIDFILE'"
  fi
  local i
  for ((i = 0; i < START_TIMEOUT; i++)); do
    engine_ok && { log "dockerd ready ($(docker info --format '{{.ServerVersion}}, {{.Driver}}' 2>/dev/null))"; return 0; }
    if [ -f "$PIDFILE" ] && ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
      tail -n 5 "$DOCKERD_LOG" >&2 || true
      die "dockerd exited at start (last log lines above; full log $DOCKERD_LOG)"
    fi
    sleep 1
  done
  tail -n 5 "$DOCKERD_LOG" >&2 || true
  die "dockerd did not answer within ${START_TIMEOUT}s (log $DOCKERD_LOG)"
}

case "${1:-start}" in
  start)
    install_packages
    install_compose_plugin
    start_dockerd
    ;;
  status)
    engine_ok || { echo "docker engine not running" >&2; exit 1; }
    compose_ok || { echo "docker compose (v2 plugin) missing" >&2; exit 1; }
    echo "engine $(docker info --format '{{.ServerVersion}}'), $(docker compose version)"
    ;;
  stop)
    if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
      pid="$(cat "$PIDFILE")"
      log "stopping dockerd (pid $pid)"
      as_root kill -TERM "$pid"
      for ((i = 0; i < 30; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
      as_root rm -f "$PIDFILE"
    else
      log "no dockerd started by this script is running"
    fi
    ;;
  *)
    echo "usage: $0 [start|status|stop]" >&2
    exit 2
    ;;
esac
