#!/usr/bin/env bash
# Run the test suite in tiers a user chooses (sets everything up first; see scripts/setup.sh).
#
#   bash scripts/test.sh                  DEFAULT tier: ruff, then every test that needs no host
#                                         change beyond set-up's (unit, Prometheus, real CPU vLLM):
#                                         no Docker engine, no firewall rules, no images
#   bash scripts/test.sh --with-compose   also the compose tier (or SPECWATCH_WITH_COMPOSE=1); this
#                                         CHANGES THE HOST (see compose_plan below; .ci/run uses it)
#   bash scripts/test.sh --plan [...]     print what would be installed, started and run; change nothing
#
# The run goes in stages, each its own pytest (a failed stage does not stop the later ones; the
# exit status is the first failure's):
#   1. lint        ruff check . (a finding stops the run here)
#   2. fast        tests/unit + tests/integration without vLLM (neither a real server nor its
#                  packages), in parallel (pytest-xdist, SPECWATCH_TEST_WORKERS workers, default
#                  two per core, at most 16: the stage waits on sockets and subprocesses as much
#                  as it computes; 1 = serial)
#   3. vLLM        tests/unit + tests/integration that need vLLM: a real server (realvllm) or only
#                  the cpu extra's packages, vllm/torch/transformers (vllmpkg); serial (one real
#                  vLLM at a time on a machine: the flock /tmp/specwatch-vllm.lock)
#   4. e2e         tests/e2e (the demo; the compose bundle with --with-compose), serial
# Other arguments go to every stage's pytest, e.g.  bash scripts/test.sh -k exporter
# (a stage they select nothing in is reported as such, not failed). With -m the stages are not
# used: ONE serial pytest runs with that -m, e.g.  bash scripts/test.sh -m "not realvllm and not vllmpkg"
# (the fast tiers; a later -m replaces the default one).
# Tiers are pytest markers (pyproject.toml): realvllm, prometheus and compose need the real stack,
# vllmpkg the cpu extra's packages (no server); the folders tests/unit, tests/integration,
# tests/e2e add unit, integration, e2e (-m unit).
# Without --with-compose the compose tests are deselected AND skipped (SPECWATCH_SKIP_COMPOSE=1),
# so no -m given here can make them change the host.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SPECWATCH_VENV:-$here/.venv}"

# Estimates (README "The two commands"): issue #25's fresh-clone run of everything took 22 minutes
# on 2 cores, of which the compose tier 7-12 (docs/compose.md, "Build and bring-up times").
DEFAULT_ESTIMATE="about 15-30 minutes on 2 cores after set-up (27 minutes measured on a fresh clone on 2026-12-02 with the cores shared; the real-vLLM tests also wait for the machine-wide vLLM lock while another vLLM runs)"
COMPOSE_ESTIMATE="7-12 more minutes with Docker's cache warm; a first run builds the images first (4.5 GB; 5-8 minutes on an idle machine, 36 minutes measured on a heavily loaded one)"

truthy() { case "$(printf '%s' "${1:-}" | tr '[:upper:]' '[:lower:]')" in ""|0|false|no) return 1 ;; *) return 0 ;; esac; }

with_compose=0
plan_only=0
args=()
for a in "$@"; do
  case "$a" in
    --with-compose) with_compose=1 ;;
    --plan) plan_only=1 ;;
    *) args+=("$a") ;;
  esac
done
truthy "${SPECWATCH_WITH_COMPOSE:-}" && with_compose=1

compose_plan() {
  cat >&2 <<'PLAN'
[test] --with-compose: the compose tier CHANGES THIS HOST before its tests run:
[test]   - installs, when missing (apt-get, root or sudo): Debian's docker.io and debootstrap, and the
[test]     Compose v2 plugin (Debian trixie's docker-compose) into /usr/local/lib/docker/cli-plugins
[test]   - starts a root dockerd (log /var/log/specwatch-dockerd.log); one started here is stopped at the end
[test]   - builds 4 images (Debian base by debootstrap, exporter, CPU vLLM, stand-in Prometheus):
[test]     about 4.5 GB in /var/lib/docker, KEPT as Docker's cache for the next run
[test]     (remove: docker image prune -a, or docker rmi the specwatch-e2e/* and specwatch-base images)
[test]   - adds iptables rules to Docker's DOCKER-USER chain while the stack runs (removed at the end)
[test]   - brings one compose project up (cpu, bench) and takes it down with the documented command
PLAN
}

if [ "$with_compose" = 1 ]; then
  export SPECWATCH_WITH_COMPOSE=1
  unset SPECWATCH_SKIP_COMPOSE
  tier=(); nocompose=""; tier_name="default tier + compose tier"
  estimate="$DEFAULT_ESTIMATE; $COMPOSE_ESTIMATE"
else
  export SPECWATCH_SKIP_COMPOSE=1
  tier=(-m "not compose"); nocompose=" and not compose"; tier_name="default tier (no Docker: the compose tier is opt-in, bash scripts/test.sh --with-compose)"
  estimate="$DEFAULT_ESTIMATE"
fi
# Stages 2 and 3 (below): the fast stage leaves vLLM out, server (realvllm) and packages (vllmpkg:
# importing vllm or torch costs seconds of CPU per process); the vLLM stage runs both, serially.
fast_expr="(unit or integration) and not realvllm and not vllmpkg$nocompose"
# Two workers per core (at most 16): the fast stage spends about as long waiting (stub servers,
# sockets, tmux, promtool, deliberate stalls) as computing, so two per core overlap the waits;
# docs/development.md ("Test-suite timings") has the side-by-side runs.
default_workers=$(( 2 * $(nproc) )); [ "$default_workers" -gt 16 ] && default_workers=16
workers="${SPECWATCH_TEST_WORKERS:-$default_workers}"
vllm_expr="(unit or integration) and (realvllm or vllmpkg)$nocompose"

if [ "$plan_only" = 1 ]; then
  bash "$here/scripts/setup.sh" --plan
  [ "$with_compose" = 1 ] && compose_plan
  echo "[test] would run: ruff check . ; then the selection ${tier[*]:+${tier[0]} \"${tier[1]}\"} ${args[*]:-} in stages (given -m or -n: one pytest with the arguments as given):" >&2
  echo "[test]   2/4 fast: pytest -ra -m \"$fast_expr\" -n $workers --dist loadfile ${args[*]:-}" >&2
  echo "[test]   3/4 vLLM: pytest -ra -m \"$vllm_expr\" ${args[*]:-}" >&2
  echo "[test]   4/4 e2e:  pytest -ra -m \"e2e$nocompose\" ${args[*]:-}" >&2
  echo "[test] $tier_name; $estimate" >&2
  [ "$with_compose" = 1 ] || echo "[test] SPECWATCH_SKIP_COMPOSE=1 (compose tests skipped even if selected)" >&2
  exit 0
fi

bash "$here/scripts/setup.sh"
cd "$here"
# The suite starts hundreds of Python processes (specwatch commands, stub servers, xdist workers).
# With PYTHONDONTWRITEBYTECODE set (some CI images set it), each one compiles specwatch's modules
# from source again and every pytest worker rewrites every test module again (docs/development.md says
# what that costs). Bytecode goes to __pycache__ folders (git- and docker-ignored).
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
  echo "[test] PYTHONDONTWRITEBYTECODE unset for the tests (bytecode is cached in __pycache__, git-ignored)" >&2
  unset PYTHONDONTWRITEBYTECODE
fi
[ "$with_compose" = 1 ] && compose_plan
echo "[test] $tier_name" >&2
echo "[test] $estimate" >&2
echo "[test] stage 1/4 lint: ruff check ." >&2
"$venv/bin/ruff" check .

# A user's -m (or -n) replaces the stages with one pytest run as they asked.
for a in "${args[@]}"; do
  case "$a" in
    -m|-m*|--markexpr|--markexpr=*|-n|-n*|--numprocesses|--numprocesses=*)
      echo "[test] $a given: one pytest run with the arguments as given (no stages)" >&2
      exec "$venv/bin/python" -m pytest -ra "${tier[@]}" "${args[@]}" ;;
  esac
done

status=0
summary=()
stage() {  # stage NAME MARKEXPR PYTEST-ARGS...
  local name="$1" expr="$2"; shift 2
  local start rc=0
  start=$(date +%s)
  echo "[test] stage $name: pytest -m \"$expr\" $*" >&2
  "$venv/bin/python" -m pytest -ra -m "$expr" "$@" "${args[@]}" || rc=$?
  local took=$(( $(date +%s) - start ))
  case "$rc" in
    0) summary+=("$name: passed ($took s)") ;;
    5) summary+=("$name: no test selected ($took s)") ;;
    *) summary+=("$name: FAILED, pytest exit $rc ($took s)"); [ "$status" = 0 ] && status=$rc ;;
  esac
}
# -p no:randomly is not needed: the project does not use random ordering. --dist loadfile keeps a
# module's tests (and its module fixtures) on one worker.
if [ "$workers" = 1 ] || [ "$workers" = 0 ]; then par=(); else par=(-n "$workers" --dist loadfile); fi
stage "2/4 fast (unit + integration, no vLLM)" "$fast_expr" "${par[@]}"
stage "3/4 vLLM (real server or its packages)" "$vllm_expr"
stage "4/4 e2e" "e2e$nocompose"
for line in "${summary[@]}"; do echo "[test] $line" >&2; done
echo "[test] exit $status" >&2
exit "$status"
