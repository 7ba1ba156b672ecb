"""The mixin's one generator, ``python -m specwatch.mixin.generate``: everything (rules, alerts,
scrape configs, Kubernetes objects, dashboards) from one MixinConfig, under ``--root`` (default:
the current directory), and ``dashboards/generate.py`` as a shim of it (docs/mixin.md).

Fast tier: no promtool, no Prometheus; every write goes to a temp copy (the ``mixin_root``
fixture), never to the checkout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specwatch.mixin.config import DEFAULT_CONFIG, load_config
from specwatch.mixin.dashboards import render_dashboards
from specwatch.mixin.generate import render_all

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_NAMES = ("choosing-k.json", "load-test.json", "speculative-decoding.json")
PROD = "vllm_selector: 'job=\"prod-vllm\"'\nexporter_selector: 'job=\"prod-specwatch\"'\nrate_window: 10m\n"


def generate(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specwatch.mixin.generate", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_check_passes_on_the_repository():
    r = generate("--check")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert r.stdout.strip().endswith("generated files are up to date")
    r = generate("--check", "--root", str(REPO), cwd=REPO / "tests")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr


def test_every_generated_file_is_rendered_and_nothing_else():
    """render_all names exactly the files under prometheus/ and dashboards/generated/ that are
    generated (hand-written ones, such as prometheus/runbook.md and prometheus/tests/, are not)."""
    files = render_all(DEFAULT_CONFIG, REPO)
    assert {f"dashboards/generated/{n}" for n in (*DASHBOARD_NAMES, ".lint")} <= set(files)
    assert {f"prometheus/kubernetes/dashboards_out/{n}" for n in DASHBOARD_NAMES} <= set(files)
    for rel, text in files.items():
        assert (REPO / rel).read_text() == text, rel
    assert not any(rel.startswith(("prometheus/tests/", "prometheus/runbook")) for rel in files)


def test_default_root_is_the_current_directory(mixin_root):
    """Without --root the generator reads and writes the current directory, not the checkout
    this package came from."""
    victim = mixin_root / "prometheus" / "rules" / "specwatch-alerts.yml"
    victim.write_text(victim.read_text() + "# edited\n")
    r = generate("--check", cwd=mixin_root)
    assert r.returncode == 1 and "out of date: prometheus/rules/specwatch-alerts.yml" in r.stderr, r.stderr
    assert generate("--check", cwd=REPO).returncode == 0  # the checkout is untouched
    w = generate(cwd=mixin_root)
    assert w.returncode == 0 and f"wrote {victim}" in w.stdout, w.stdout + w.stderr
    assert victim.read_text() == (REPO / "prometheus" / "rules" / "specwatch-alerts.yml").read_text()


def test_root_pointing_at_a_copy_writes_everything_there(mixin_root, tmp_path):
    """--root DIR from another directory: a fresh copy without any generated file gets every one
    of them back, byte for byte the committed files."""
    for rel in render_all(DEFAULT_CONFIG, REPO):
        (mixin_root / rel).unlink()
    assert generate("--check", "--root", str(mixin_root), cwd=tmp_path).returncode == 1
    w = generate("--root", str(mixin_root), cwd=tmp_path)
    assert w.returncode == 0, w.stderr
    for rel in render_all(DEFAULT_CONFIG, REPO):
        assert (mixin_root / rel).read_bytes() == (REPO / rel).read_bytes(), rel
    r = generate("--check", "--root", str(mixin_root), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr


def test_a_config_changes_the_dashboards_and_the_kubernetes_copy_identically(mixin_root, tmp_path):
    """--config X renders the dashboards once: dashboards/generated/ and the Kubernetes layout's
    dashboards_out/ hold the same text, X's selectors and window, and differ from the defaults'."""
    cfg_file = tmp_path / "prod.yml"
    cfg_file.write_text(PROD)
    w = generate("--root", str(mixin_root), "--config", str(cfg_file))
    assert w.returncode == 0, w.stderr
    generated = mixin_root / "dashboards" / "generated"
    k8s = mixin_root / "prometheus" / "kubernetes" / "dashboards_out"
    for name in DASHBOARD_NAMES:
        text = (generated / name).read_text()
        assert (k8s / name).read_text() == text, name
        assert text != (REPO / "dashboards" / "generated" / name).read_text(), name
        exprs = "\n".join(t["expr"] for p in json.loads(text)["panels"] for t in p.get("targets", []) if "expr" in t)
        assert "prod-vllm" in exprs or "prod-specwatch" in exprs, name
        assert DEFAULT_CONFIG.vllm_selector not in exprs and DEFAULT_CONFIG.exporter_selector not in exprs, name
    assert 'job="prod-specwatch"' in (mixin_root / "prometheus" / "rules" / "specwatch-rules.yml").read_text()
    assert generate("--check", "--root", str(mixin_root), "--config", str(cfg_file)).returncode == 0
    r = generate("--check", "--root", str(mixin_root))  # the defaults: both copies are now stale
    assert r.returncode == 1
    for name in DASHBOARD_NAMES:
        assert f"dashboards/generated/{name}" in r.stderr and f"prometheus/kubernetes/dashboards_out/{name}" in r.stderr


def test_the_kubernetes_dashboards_are_not_copied_from_dashboards_generated(mixin_root):
    """Whatever dashboards/generated/ holds (here: another config's output, then junk), the
    Kubernetes dashboards are the ones rendered from the generator's own config."""
    generated = mixin_root / "dashboards" / "generated"
    for name in DASHBOARD_NAMES:
        (generated / name).write_text('{"junk": true}\n')
    cfg = load_config(None)
    files = render_all(cfg, mixin_root)
    rendered = render_dashboards(cfg, REPO / "dashboards")
    for name in DASHBOARD_NAMES:
        assert files[f"prometheus/kubernetes/dashboards_out/{name}"] == files[f"dashboards/generated/{name}"] == rendered[name]
        assert "junk" not in files[f"prometheus/kubernetes/dashboards_out/{name}"]


@pytest.mark.parametrize("case", ["empty", "no-prometheus", "a-file", "missing"])
def test_a_bad_root_is_one_line_and_exit_2(tmp_path, mixin_root, case):
    if case == "empty":
        root = tmp_path / "empty"
        root.mkdir()
        what = "dashboards/*.dashboard.py"
    elif case == "no-prometheus":
        root = mixin_root
        for p in sorted((root / "prometheus").rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        (root / "prometheus").rmdir()
        what = "prometheus/"
    elif case == "a-file":
        root = tmp_path / "README.md"
        root.write_text("not a directory\n")
        what = "dashboards/*.dashboard.py"
    else:
        root = tmp_path / "does-not-exist"
        what = "dashboards/*.dashboard.py"
    for args in (["--root", str(root)], ["--root", str(root), "--check"]):
        r = generate(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert len(r.stderr.splitlines()) == 1 and str(root) in r.stderr and what in r.stderr, r.stderr
        assert r.stdout == "", r.stdout
    if case == "no-prometheus":
        assert not (root / "prometheus").exists()  # nothing was written


def test_a_dashboard_source_without_build_is_one_line(mixin_root):
    (mixin_root / "dashboards" / "broken.dashboard.py").write_text("dashboard = None  # the former injected-global style\n")
    r = generate("--check", "--root", str(mixin_root))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "broken.dashboard.py: defines no build(cfg)" in r.stderr


def test_the_generator_without_grafanalib_names_the_extra():
    """Importing the generator needs only the core (tests/unit/test_architecture.py); running it renders
    the dashboards, so it reports the mixin extra in one line when grafanalib is missing."""
    code = ("import runpy, sys\n"
            "class _Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'grafanalib':\n"
            "            raise ModuleNotFoundError(f'blocked: {name}', name=name)\n"
            "sys.meta_path.insert(0, _Block())\n"
            "sys.argv = ['generate', '--check']\n"
            "runpy.run_module('specwatch.mixin.generate', run_name='__main__')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr[-2000:]
    assert "'grafanalib'" in r.stderr and "specwatch[mixin]" in r.stderr


def test_dashboards_are_imported_without_sys_path_changes():
    """The dashboards/ modules load as one package from a module spec: no sys.path entry, no
    top-level ``lib``/``promql`` modules, and sources are submodules of that package."""
    code = ("import sys\n"
            "from pathlib import Path\n"
            "from specwatch.mixin.config import DEFAULT_CONFIG\n"
            "from specwatch.mixin.dashboards import package_name, render_dashboards\n"
            "before = list(sys.path)\n"
            "d = Path('dashboards')\n"
            "render_dashboards(DEFAULT_CONFIG, d)\n"
            "pkg = package_name(d)\n"
            "print(sys.path == before, 'lib' in sys.modules, 'promql' in sys.modules,\n"
            "      sorted(m[len(pkg):] for m in sys.modules if m.startswith(pkg)))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == ("True False False ['', '.choosing_k', '.lib', '.load_test', '.promql', "
                                "'.speculative_decoding']")


def test_the_dashboards_shim_runs_the_same_generator(mixin_root, tmp_path):
    """``python dashboards/generate.py`` (a copy's, run from elsewhere) generates that copy's
    whole mixin, as --root would: a --config reaches the dashboards and the Kubernetes copy alike."""
    cfg_file = tmp_path / "prod.yml"
    cfg_file.write_text(PROD)
    shim = mixin_root / "dashboards" / "generate.py"
    r = subprocess.run([sys.executable, str(shim), "--check"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0 and "up to date" in r.stdout, r.stdout[-2000:] + r.stderr
    r = subprocess.run([sys.executable, str(shim), "--config", str(cfg_file)], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    for name in DASHBOARD_NAMES:
        text = (mixin_root / "dashboards" / "generated" / name).read_text()
        assert "prod-vllm" in text and (mixin_root / "prometheus" / "kubernetes" / "dashboards_out" / name).read_text() == text
    r = subprocess.run([sys.executable, str(shim), "--check"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 1 and "python -m specwatch.mixin.generate --root " in r.stderr, r.stderr
