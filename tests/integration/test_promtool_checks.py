"""promtool on what the unit tier checks without it (moved from tests/unit/test_exporter.py and
tests/unit/test_kubernetes.py): the golden exposition passes ``promtool check metrics``, the
Kubernetes rules ``promtool check rules``. Each skips when promtool is not installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from exporter_helpers import FIXTURES

# as in tests/unit/test_exporter.py and tests/unit/test_kubernetes.py
GOLDEN = FIXTURES.parent / "golden" / "exporter-k4-after-traffic.prom"
K8S = Path(__file__).resolve().parents[2] / "prometheus" / "kubernetes"


def load(name: str) -> dict:
    return yaml.safe_load((K8S / "operator" / name).read_text())


def test_golden_passes_promtool_check_metrics():
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (scripts/setup.sh installs it)")
    r = subprocess.run([promtool, "check", "metrics"], input=GOLDEN.read_text(), capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_prometheusrule_rules_pass_promtool(tmp_path):
    groups = tmp_path / "groups.yml"
    groups.write_text(yaml.safe_dump({"groups": load("prometheusrule.yaml")["spec"]["groups"]}))
    for f in (groups, K8S / "prometheus_rules.yaml", K8S / "prometheus_alerts.yaml"):
        r = subprocess.run(["promtool", "check", "rules", str(f)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
