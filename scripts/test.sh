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
# Other arguments go to pytest, e.g.  bash scripts/test.sh -k exporter
# or  bash scripts/test.sh -m "not realvllm"  (the fast tiers; a later -m replaces the default one).
# Tiers are pytest markers (pyproject.toml): realvllm, prometheus and compose need the real stack;
# the folders tests/unit, tests/integration, tests/e2e add unit, integration, e2e (-m unit).
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
  tier=(); tier_name="default tier + compose tier"
  estimate="$DEFAULT_ESTIMATE; $COMPOSE_ESTIMATE"
else
  export SPECWATCH_SKIP_COMPOSE=1
  tier=(-m "not compose"); tier_name="default tier (no Docker: the compose tier is opt-in, bash scripts/test.sh --with-compose)"
  estimate="$DEFAULT_ESTIMATE"
fi

if [ "$plan_only" = 1 ]; then
  bash "$here/scripts/setup.sh" --plan
  [ "$with_compose" = 1 ] && compose_plan
  echo "[test] would run: ruff check . ; pytest -ra ${tier[*]:+${tier[0]} \"${tier[1]}\"} ${args[*]:-}" >&2
  echo "[test] $tier_name; $estimate" >&2
  [ "$with_compose" = 1 ] || echo "[test] SPECWATCH_SKIP_COMPOSE=1 (compose tests skipped even if selected)" >&2
  exit 0
fi

bash "$here/scripts/setup.sh"
cd "$here"
[ "$with_compose" = 1 ] && compose_plan
echo "[test] $tier_name" >&2
echo "[test] $estimate" >&2
echo "[test] ruff check (lint)" >&2
"$venv/bin/ruff" check .
exec "$venv/bin/python" -m pytest -ra "${tier[@]}" "${args[@]}"
