"""What users get (the package, docs, dashboards, rules, scripts) names no file outside the repository.

The project's working notes (``shared/vllm-facts.md``, ``shared/seeds/…``, ``shared/gpu-…``) and
the paths of the machine it was developed on (``/work/…``) are not part of a checkout: a docstring or
a page that cites them sends the reader nowhere. Cite the page of docs/ that holds the fact, or state
the fact in place.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Tracked files a user reads or runs. tests/ is out (its fixtures are recorded runs that keep the
# paths they ran with), and so are the recorded data files of docs/ (docs/results/, docs/drafter-study/*.json).
SCOPE = ["exporter", "dashboards", "prometheus", "scripts", ".ci", "docs/*.md", "docs/**/*.md", "README.md",
         "docker-compose.yml", ".env.example", "pyproject.toml", ".dockerignore"]

OUTSIDE = re.compile(r"shared/vllm-facts|shared/seeds|shared/gpu-|(?<![\w.~$}-])/work/")

# Records of where a run wrote its output on the measuring machine, not references a reader has to
# follow: results.md quotes the command line of the loaded verify run (its output directory
# /work/runs/verify-loaded) and says two stopped runs' output under /work/runs was not committed.
ALLOWED = {"docs/results.md": re.compile(r"/work/runs\b")}


def tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *SCOPE], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    files = sorted({f for f in out.decode().split("\0") if f})
    return [f for f in files if not f.startswith("docs/results/") or f.endswith(".md")]


def outside_references(rel: str, text: str) -> list[str]:
    allowed = ALLOWED.get(rel)
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for m in OUTSIDE.finditer(line):
            if allowed is not None and allowed.match(line, m.start()):
                continue
            found.append(f"{rel}:{lineno}: {line.strip()}")
    return found


def test_the_scope_covers_the_package_and_the_docs():
    files = tracked_files()
    assert "exporter/specwatch/specdecode/derive.py" in files
    assert "docs/drafter-study.md" in files and "docs/cost.md" in files and "README.md" in files
    assert any(f.startswith("dashboards/") for f in files) and any(f.startswith("prometheus/") for f in files)
    assert any(f.startswith("scripts/") for f in files)


def test_no_tracked_file_names_a_file_outside_the_repository():
    found = []
    for rel in tracked_files():
        path = ROOT / rel
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary (images, model files)
            continue
        found += outside_references(rel, data.decode("utf-8", errors="replace"))
    assert not found, "references to files outside the repository:\n" + "\n".join(found)


@pytest.mark.parametrize("line", [
    "Over an interval (see ``shared/vllm-facts.md``):",
    "measured (`shared/seeds/003_…`, in Japanese)",
    "(`vllm bench forward`, `../shared/gpu-verify-cost-h200.md`)",
    "python = /work/main/.venv/bin/python",
    "see /work/runs/x",
])
def test_the_pattern_catches_each_kind(line):
    assert outside_references("docs/x.md", line)
    assert outside_references("docs/results.md", line) or "/work/runs" in line


@pytest.mark.parametrize("line", [
    "https://example.org/work/x",
    "the network/work/queue split",
    "~/work/specwatch",
    "shared/ volume of the compose project",
])
def test_the_pattern_spares_ordinary_text(line):
    assert not outside_references("docs/x.md", line)
