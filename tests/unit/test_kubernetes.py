"""The Kubernetes outputs of the mixin generator (prometheus/kubernetes/): the monitoring-mixins
layout and the Prometheus Operator objects, validated against the operator's own CRD schemas
(tests/fixtures/crds, see its README) with jsonschema, plus what the API server's field
validation adds (no unknown fields), and checked to agree with the plain Prometheus files and
with the exporter's own configuration parser."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from specwatch.exporter.config import DEFAULT_PORT, build_config
from specwatch.mixin.config import MixinConfig
from specwatch.mixin.generate import render_all
from specwatch.mixin.kubernetes import KubernetesOptions, sidecar_container

REPO = Path(__file__).resolve().parents[2]
PROM = REPO / "prometheus"
K8S = PROM / "kubernetes"
CRDS = Path(__file__).parents[1] / "fixtures" / "crds"


def crd_schema(kind: str) -> dict:
    """The openAPIV3Schema of the served version of the CRD for ``kind``."""
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            (version,) = [v for v in crd["spec"]["versions"] if v.get("served") and v.get("storage")]
            assert crd["spec"]["group"] + "/" + version["name"] == "monitoring.coreos.com/v1"
            return version["schema"]["openAPIV3Schema"]
    raise AssertionError(f"no CRD for {kind} in {CRDS}")


def unknown_fields(obj, schema: dict, path: str = "") -> list[str]:
    """Fields the structural schema does not declare (the API server prunes them, or rejects them
    under strict field validation): a typo that jsonschema alone would let through."""
    out = []
    if isinstance(obj, dict) and "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        props = schema["properties"]
        for key, value in obj.items():
            if path == "" and key in ("apiVersion", "kind", "metadata"):
                continue
            if key not in props:
                out.append(f"{path}.{key}")
            else:
                out += unknown_fields(value, props[key], f"{path}.{key}")
    elif isinstance(obj, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, value in obj.items():
            out += unknown_fields(value, schema["additionalProperties"], f"{path}.{key}")
    elif isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            out += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return out


def validate(obj: dict) -> list[str]:
    """Problems of a custom resource against its CRD: schema errors and unknown fields."""
    schema = crd_schema(obj["kind"])
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]
    errors += [f"unknown field {f}" for f in unknown_fields(obj, schema)]
    name = obj.get("metadata", {}).get("name", "")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", name) or len(name) > 253:
        errors.append(f"metadata.name {name!r} is not a DNS subdomain")
    return errors


OBJECTS = {"prometheusrule.yaml": "PrometheusRule", "podmonitor-vllm.yaml": "PodMonitor",
           "podmonitor-specwatch.yaml": "PodMonitor"}


def load(name: str) -> dict:
    return yaml.safe_load((K8S / "operator" / name).read_text())


def test_crd_fixtures_are_the_operators():
    readme = (CRDS / "README.md").read_text()
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        assert crd["kind"] == "CustomResourceDefinition" and path.name in readme
        assert crd["metadata"]["annotations"]["operator.prometheus.io/version"] in readme


@pytest.mark.parametrize("name, kind", OBJECTS.items())
def test_operator_objects_validate_against_the_crds(name, kind):
    obj = load(name)
    assert obj["apiVersion"] == "monitoring.coreos.com/v1" and obj["kind"] == kind
    assert validate(obj) == []


@pytest.mark.parametrize("name, breakage, expected", [
    ("podmonitor-vllm.yaml", lambda o: o["spec"].pop("selector"), "'selector' is a required property"),
    ("podmonitor-vllm.yaml", lambda o: o["spec"]["podMetricsEndpoints"][0].update(interval="15 seconds"), "does not match"),
    ("podmonitor-specwatch.yaml", lambda o: o["spec"].update(podMetricEndpoints=[]), "unknown field .spec.podMetricEndpoints"),
    ("prometheusrule.yaml", lambda o: o["spec"]["groups"][0]["rules"][0].pop("expr"), "'expr' is a required property"),
    ("prometheusrule.yaml", lambda o: o["spec"]["groups"][0].update(rule=[]), "unknown field .spec.groups[0].rule"),
])
def test_validation_catches_broken_objects(name, breakage, expected):
    obj = copy.deepcopy(load(name))
    breakage(obj)
    problems = validate(obj)
    assert any(expected in p for p in problems), problems


def test_prometheusrule_holds_the_plain_rule_files():
    plain = [g for f in ("rules/specwatch-rules.yml", "rules/specwatch-alerts.yml")
             for g in yaml.safe_load((PROM / f).read_text())["groups"]]
    assert load("prometheusrule.yaml")["spec"]["groups"] == plain


def test_mixin_layout():
    assert (K8S / "prometheus_rules.yaml").read_text() == (PROM / "rules" / "specwatch-rules.yml").read_text()
    assert (K8S / "prometheus_alerts.yaml").read_text() == (PROM / "rules" / "specwatch-alerts.yml").read_text()
    generated = sorted(p.name for p in (REPO / "dashboards" / "generated").glob("*.json"))
    assert generated and sorted(p.name for p in (K8S / "dashboards_out").glob("*.json")) == generated
    for name in generated:
        assert json.loads((K8S / "dashboards_out" / name).read_text())["uid"]


def test_pod_monitors_give_the_jobs_and_labels_the_rules_select_on():
    cfg = MixinConfig()
    vllm, exporter = load("podmonitor-vllm.yaml"), load("podmonitor-specwatch.yaml")

    def relabel(pm):
        return pm["spec"]["podMetricsEndpoints"][0]["relabelings"]

    assert {"action": "replace", "targetLabel": "job", "replacement": "vllm"} in relabel(vllm)
    assert cfg.vllm_selector == 'job="vllm"' and cfg.exporter_selector == 'job="specwatch"'
    assert {"action": "replace", "targetLabel": "job", "replacement": "specwatch"} in relabel(exporter)
    # vLLM's series get upstream = pod name, the name the sidecar gives its upstream
    up = [r for r in relabel(vllm) if r.get("targetLabel") == "upstream"]
    assert up == [{"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "upstream"}]
    sidecar = yaml.safe_load((K8S / "operator" / "specwatch-sidecar.yaml").read_text())
    (container,) = sidecar["spec"]["template"]["spec"]["containers"]
    assert container == sidecar_container()
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert exporter["spec"]["podMetricsEndpoints"][0]["port"] == container["ports"][0]["name"]
    assert len(container["ports"][0]["name"]) <= 15  # a Kubernetes port name
    assert vllm["spec"]["selector"] == exporter["spec"]["selector"]  # the same pods


def test_sidecar_arguments_are_valid_serve_flags():
    """The sidecar's args, with the pod name Kubernetes substitutes for $(POD_NAME), are accepted
    by `specwatch serve`'s own configuration."""
    c = sidecar_container()
    assert c["args"][0] == "serve"
    args = [a.replace("$(POD_NAME)", "vllm-7d9c5b6f4-x2x8q") for a in c["args"][1:]]
    ups = [a.split("=", 1)[1] for a in args if a.startswith("--upstream=")]
    wins = [a.split("=", 1)[1] for a in args if a.startswith("--window=")]
    (listen,) = [a.split("=", 1)[1] for a in args if a.startswith("--listen-address=")]
    cfg = build_config(ups, wins, listen)
    assert cfg.upstreams[0].name == "vllm-7d9c5b6f4-x2x8q"
    assert cfg.upstreams[0].metrics_url == f"http://127.0.0.1:{KubernetesOptions().vllm_container_port}/metrics"
    assert cfg.listen_port == DEFAULT_PORT == c["ports"][0]["containerPort"]
    # serve's own CLI takes them too: one --once round against the sidecar's vLLM port on this
    # machine (usually closed: up 0; a real vLLM of another test run may be listening there: up 1)
    r = subprocess.run([sys.executable, "-m", "specwatch", *c["args"][:1], *args, "--once", "--timeout", "0.5"],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r'^specwatch_up\{upstream="vllm-7d9c5b6f4-x2x8q"\} ([01])\.0$', r.stdout, re.M)
    assert m, r.stdout
    assert r.returncode == (0 if m.group(1) == "1" else 3), r  # --once: 3 when every upstream is down


def generate(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specwatch.mixin.generate", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_generate_check_covers_the_kubernetes_files(mixin_root):
    assert any(k.startswith("prometheus/kubernetes/operator/") for k in render_all(MixinConfig(), REPO))
    out = mixin_root / "prometheus"
    pm = out / "kubernetes" / "operator" / "podmonitor-vllm.yaml"
    pm.write_text(pm.read_text().replace("interval: 15s", "interval: 30s"))
    (out / "kubernetes" / "dashboards_out" / "load-test.json").unlink()
    r = generate("--check", "--root", str(mixin_root))
    assert r.returncode == 1
    assert "kubernetes/operator/podmonitor-vllm.yaml" in r.stderr and "kubernetes/dashboards_out/load-test.json" in r.stderr
    assert generate("--root", str(mixin_root)).returncode == 0
    assert pm.read_text() == (K8S / "operator" / "podmonitor-vllm.yaml").read_text()


def test_committed_kubernetes_and_mixin_outputs_are_up_to_date():
    """The fast tier's check (no promtool) that prometheus/ as committed, Kubernetes and mixin
    outputs included, is exactly what the generator writes, with no stray file beside them."""
    r = generate("--check")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert "up to date" in r.stdout
    files = render_all(MixinConfig(), REPO)
    assert {"prometheus/kubernetes/prometheus_rules.yaml", "prometheus/kubernetes/prometheus_alerts.yaml",
            "prometheus/kubernetes/operator/prometheusrule.yaml"} <= set(files)
    assert any(k.startswith("prometheus/kubernetes/dashboards_out/") for k in files)


def test_generate_check_finds_stray_files_in_the_generated_directories(mixin_root):
    """A file left in prometheus/kubernetes/ or dashboards/generated/ (a renamed object, a dashboard
    no longer generated) fails --check by name; regenerating removes it."""
    k8s, dash = mixin_root / "prometheus" / "kubernetes", mixin_root / "dashboards" / "generated"
    strays = [k8s / "operator" / "podmonitor-old.yaml", k8s / "dashboards_out" / "gone.json", k8s / "extra" / "notes.txt",
              dash / "gone.json"]
    for p in strays:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("{}\n")
    r = generate("--check", "--root", str(mixin_root))
    assert r.returncode == 1, r.stdout + r.stderr
    for p in strays:
        assert p.relative_to(mixin_root).as_posix() in r.stderr
    w = generate("--root", str(mixin_root))
    assert w.returncode == 0, w.stderr
    assert not any(p.exists() for p in strays) and w.stdout.count("removed ") == len(strays)
    r = generate("--check", "--root", str(mixin_root))
    assert r.returncode == 0, r.stdout + r.stderr
