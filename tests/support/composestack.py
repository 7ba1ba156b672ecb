"""Helpers for the compose end-to-end test (tests/e2e/test_compose_e2e.py): the local Docker engine,
the images built on this machine, one compose project under its own name, and Prometheus' HTTP API.

Nothing here pulls from a public image registry: the images are built from the repository on a
Debian base made with debootstrap (scripts/build_base_image.sh, scripts/build_local_images.sh).
Network traffic goes only to 127.0.0.1 (published ports, the local torch index during the build)
and, from inside the project's own containers, to each other; image builds reach the package
registries (Debian, PyPI).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

import polling

from specwatch.common.processes import free_port as free_port  # the one free_port, re-exported (cs.free_port)
from specwatch.common.processes import listen_error
from specwatch.localvllm import server as localvllm_server

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
SCRIPTS = ROOT / "scripts"
LOCK_PATH = localvllm_server.LOCK_PATH  # one real vLLM at a time on this machine

#: Label on every image the test builds (old, untagged ones are pruned by it).
IMAGE_LABEL = "org.specwatch.e2e=1"
#: The test's image tags; the override file points the services' image: lines at them.
IMAGES = {
    "exporter": "specwatch-e2e/exporter:local",
    "vllm-cpu": "specwatch-e2e/vllm-cpu:local",
    "prometheus": "specwatch-e2e/prometheus:local",
}
#: service -> image key (bench runs the exporter image, as in docker-compose.yml)
SERVICE_IMAGES = {"vllm-cpu": "vllm-cpu", "exporter": "exporter", "bench": "exporter", "prometheus": "prometheus"}
PROJECT_PREFIX = "specwatch-e2e-"
#: The teardown README.md and docs/compose.md document (after ``docker compose``): every profile,
#: whatever COMPOSE_PROFILES in .env says (tests/unit/test_first_hour.py checks the docs say it).
DOWN_ARGS = ("--profile", "*", "down", "-v")
TORCH_WHEEL_GLOB = "torch-2.13.0+cpu-*.whl"


class EngineUnavailable(RuntimeError):
    """No Docker engine with Compose v2 here, and scripts/docker_engine.sh could not make one
    (its one-line reason is the message)."""


# ------------------------------------------------------------------------------------------------
# engine and images
# ------------------------------------------------------------------------------------------------


def ensure_engine(timeout: float = 900.0) -> str:
    """Install (if missing) and start the engine with ``scripts/docker_engine.sh start``.

    Returns the engine and Compose versions. Raises:
        EngineUnavailable: the script's one-line reason (exit 3), or its last line otherwise.
    """
    res = subprocess.run(["bash", str(SCRIPTS / "docker_engine.sh"), "start"],
                         capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        reason = next((ln for ln in reversed(lines) if ln.startswith("docker engine unavailable:")),
                      lines[-1] if lines else f"scripts/docker_engine.sh exited with {res.returncode}")
        raise EngineUnavailable(reason)
    ver = subprocess.run(["bash", str(SCRIPTS / "docker_engine.sh"), "status"], capture_output=True, text=True, timeout=60)
    return ver.stdout.strip()


def engine_up() -> bool:
    """Whether a Docker engine answers now (``docker info`` exits 0)."""
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False


def stop_engine() -> str:
    """``scripts/docker_engine.sh stop``: stops the dockerd that script started (its pid file), and
    nothing else. Returns its log line."""
    res = subprocess.run(["bash", str(SCRIPTS / "docker_engine.sh"), "stop"], capture_output=True, text=True, timeout=120)
    return (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]


def torch_wheel_dir() -> Path | None:
    """Directory with a local torch 2.13.0+cpu wheel for the CPU image (``SPECWATCH_TORCH_WHEEL_DIR``,
    else /opt/wheels when it holds one), or None: then the build uses PyTorch's CPU index."""
    for cand in (os.environ.get("SPECWATCH_TORCH_WHEEL_DIR"), "/opt/wheels"):
        if cand and any(Path(cand).glob(TORCH_WHEEL_GLOB)):
            return Path(cand)
    return None


def build_images(timings_file: Path, timeout: float = 3600.0) -> dict[str, int]:
    """Build the base image (when missing), the exporter and CPU vLLM images from the repository,
    and the stand-in Prometheus, under the :data:`IMAGES` tags (scripts/build_local_images.sh).

    Returns ``{"base"|"exporter"|"vllm-cpu"|"prometheus": seconds}``. Raises RuntimeError with the
    script's last lines when a build fails.
    """
    timings_file.unlink(missing_ok=True)
    cmd = ["bash", str(SCRIPTS / "build_local_images.sh"),
           "--exporter-tag", IMAGES["exporter"], "--vllm-cpu-tag", IMAGES["vllm-cpu"],
           "--prometheus-tag", IMAGES["prometheus"], "--label", IMAGE_LABEL, "--timings", str(timings_file)]
    wheels = torch_wheel_dir()
    if wheels is not None:
        cmd += ["--torch-wheel-dir", str(wheels)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError("building the images failed:\n" + "\n".join(res.stderr.splitlines()[-30:]))
    out = {}
    for line in timings_file.read_text().splitlines():
        name, secs = line.split()
        out[name] = int(secs)
    # Untagged leftovers of earlier builds of the test's own images (never anything else).
    subprocess.run(["docker", "image", "prune", "-f", "--filter", f"label={IMAGE_LABEL}"],
                   capture_output=True, text=True, timeout=300)
    return out


def docker(*args: str, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
    return res


def wait_exit_while_progressing(cid: str, progress, stall_limit: float, total_limit: float,
                                interval: float = 5.0) -> int:
    """Wait for container ``cid`` to exit and return its exit code, as long as it makes progress:
    ``progress()`` returns a number that grows while the work goes on (e.g. vLLM's
    ``vllm:generation_tokens_total``; None when it cannot be read). A slow or loaded machine only
    makes this take longer; it fails (AssertionError naming the limit) when nothing moved for
    ``stall_limit`` s, or after ``total_limit`` s in all."""
    start = last_move = time.monotonic()
    last = None
    while True:
        state = json.loads(docker("inspect", cid).stdout)[0]["State"]
        if state.get("Status") in ("exited", "dead"):
            return int(state.get("ExitCode", -1))
        now = time.monotonic()
        value = progress()
        if value is not None and (last is None or value > last):
            last, last_move = value, now
        if now - last_move > stall_limit:
            raise AssertionError(f"container {cid[:12]} made no progress for {stall_limit:.0f} s (last reading {last})")
        if now - start > total_limit:
            raise AssertionError(f"container {cid[:12]} still running after {total_limit:.0f} s (progress reading {last})")
        time.sleep(interval)


def project_resources(project: str) -> dict[str, list[str]]:
    """Containers (any state), networks and volumes labelled with compose project ``project``."""
    label = f"label=com.docker.compose.project={project}"
    return {
        "containers": docker("ps", "-a", "-q", "--filter", label).stdout.split(),
        "networks": docker("network", "ls", "-q", "--filter", label).stdout.split(),
        "volumes": docker("volume", "ls", "-q", "--filter", label).stdout.split(),
    }


def stale_projects() -> set[str]:
    """Names of compose projects left by earlier runs of this test (killed before their teardown)."""
    names = set()
    for kind in (["ps", "-a"], ["network", "ls"], ["volume", "ls"]):
        out = docker(*kind, "--format", '{{.Label "com.docker.compose.project"}}').stdout.split()
        names |= {n for n in out if n.startswith(PROJECT_PREFIX)}
    return names


def remove_project_resources(project: str) -> None:
    """Force-remove whatever a compose project left (containers, then networks and volumes)."""
    res = project_resources(project)
    if res["containers"]:
        docker("rm", "-f", "-v", *res["containers"], check=False, timeout=300)
    if res["networks"]:
        docker("network", "rm", *res["networks"], check=False)
    if res["volumes"]:
        docker("volume", "rm", "-f", *res["volumes"], check=False)


# ------------------------------------------------------------------------------------------------
# .env and the override file
# ------------------------------------------------------------------------------------------------


def env_example_with(values: dict[str, str], drop: tuple[str, ...] = ()) -> str:
    """.env.example's text with ``KEY=...`` lines replaced by ``values`` (single-quoted when they
    hold spaces), keys in ``drop`` removed, and keys .env.example lacks appended."""
    out, seen = [], set()
    for line in ENV_EXAMPLE.read_text().splitlines():
        m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)=", line)
        if m:
            key = m.group(1)
            if key in drop:
                continue
            if key in values:
                line = f"{key}={quote_env(values[key])}"
                seen.add(key)
        out.append(line)
    out += [f"{k}={quote_env(v)}" for k, v in values.items() if k not in seen and k not in drop]
    return "\n".join(out) + "\n"


def quote_env(value: str) -> str:
    return f"'{value}'" if re.search(r"[\s\"#$]", value) else value


def documented_cpu_bench_args() -> str:
    """The BENCH_ARGS value .env.example documents for the ``cpu`` profile (a comment line
    ``#   cpu profile: BENCH_ARGS='...'``)."""
    m = re.search(r"^#\s+cpu profile:\s+BENCH_ARGS='([^']+)'", ENV_EXAMPLE.read_text(), re.M)
    if not m:
        raise AssertionError(".env.example documents no BENCH_ARGS for the cpu profile (#   cpu profile: BENCH_ARGS='...')")
    return m.group(1)


def override_text() -> str:
    """The test-only override file: it replaces the services' ``image:`` and nothing else."""
    lines = ["# Test-only (tests/e2e/test_compose_e2e.py): images built on this machine; image: lines only.", "services:"]
    for service, key in SERVICE_IMAGES.items():
        lines += [f"  {service}:", f"    image: {IMAGES[key]}"]
    return "\n".join(lines) + "\n"


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The process environment without any variable the compose file or .env.example uses (so the
    test's env file decides), without DOCKER_BUILDKIT/COMPOSE_* settings of the caller."""
    names = {m.group(1) for m in re.finditer(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", COMPOSE_FILE.read_text())}
    names |= {m.group(1) for m in re.finditer(r"^([A-Za-z_][A-Za-z0-9_]*)=", ENV_EXAMPLE.read_text(), re.M)}
    env = {k: v for k, v in os.environ.items() if k not in names and not k.startswith("COMPOSE_")}
    env.update(extra or {})
    return env


# ------------------------------------------------------------------------------------------------
# one compose project
# ------------------------------------------------------------------------------------------------


@dataclass
class ComposeProject:
    """``docker compose -p NAME --project-directory ROOT -f docker-compose.yml -f OVERRIDE
    --env-file ENV [--profile P]...`` for one uniquely named project."""

    workdir: Path
    env_text: str
    profiles: tuple[str, ...] = ("cpu",)
    name: str = field(default_factory=lambda: f"{PROJECT_PREFIX}{os.getpid()}-{secrets.token_hex(3)}")

    def __post_init__(self):
        self.env_file = self.workdir / f"{self.name}.env"
        self.env_file.write_text(self.env_text)
        self.override_file = self.workdir / f"{self.name}.override.yml"
        self.override_file.write_text(override_text())

    def argv(self, *args: str, profiles: tuple[str, ...] | None = None) -> list[str]:
        prof = [a for p in (self.profiles if profiles is None else profiles) for a in ("--profile", p)]
        return ["docker", "compose", "-p", self.name, "--project-directory", str(ROOT), "-f", str(COMPOSE_FILE),
                "-f", str(self.override_file), "--env-file", str(self.env_file), *prof, *args]

    def run(self, *args: str, timeout: float = 300.0, check: bool = True,
            profiles: tuple[str, ...] | None = None) -> subprocess.CompletedProcess:
        res = subprocess.run(self.argv(*args, profiles=profiles), cwd=ROOT, env=clean_env(),
                             capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise RuntimeError(f"docker compose {' '.join(args)} failed ({res.returncode}):\n{res.stderr.strip()[-3000:]}")
        return res

    def container(self, service: str) -> str | None:
        ids = self.run("ps", "-a", "-q", service, check=False, profiles=("cpu", "bench")).stdout.split()
        return ids[0] if ids else None

    def inspect(self, service: str) -> dict:
        cid = self.container(service)
        if cid is None:
            raise AssertionError(f"service {service} has no container")
        return json.loads(docker("inspect", cid).stdout)[0]

    def health(self, service: str) -> tuple[str, list[dict]]:
        """(health status, the healthcheck's log: ExitCode/Output of its last runs)."""
        state = self.inspect(service)["State"]
        h = state.get("Health") or {}
        return h.get("Status", "none" if state.get("Running") else state.get("Status", "?")), h.get("Log") or []

    def wait_healthy(self, service: str, limit: float) -> float:
        """Seconds until ``service`` is healthy; AssertionError (with its healthcheck output and
        logs) if it is unhealthy, exited, or not healthy within ``limit`` s."""
        t0 = time.monotonic()
        status = "?"
        log: list[dict] = []
        while time.monotonic() - t0 < limit:
            status, log = self.health(service)
            if status == "healthy":
                return time.monotonic() - t0
            if status in ("unhealthy", "exited", "dead"):
                break
            time.sleep(2)
        last = log[-1] if log else {}
        raise AssertionError(
            f"{service} is {status!r} after {time.monotonic() - t0:.0f} s (limit {limit:.0f} s); last healthcheck: "
            f"exit {last.get('ExitCode')}: {str(last.get('Output', '')).strip()[-500:]}\n"
            f"--- logs ---\n{self.logs(service)}")

    def logs(self, service: str, tail: int = 40) -> str:
        res = self.run("logs", "--no-color", "--tail", str(tail), service, check=False, profiles=("cpu", "bench"))
        return (res.stdout + res.stderr)[-6000:]

    def down(self) -> dict[str, list[str]]:
        """Exactly the documented teardown, ``docker compose --profile '*' down -v``
        (:data:`DOWN_ARGS`; no other profile flag), then force-remove anything still labelled with
        the project. Returns what was left after ``down`` itself (the test asserts it is nothing)."""
        self.run(*DOWN_ARGS, check=False, timeout=300, profiles=())
        left = project_resources(self.name)
        if any(left.values()):
            remove_project_resources(self.name)
        return left


# ------------------------------------------------------------------------------------------------
# the network rule: nothing leaves the project network
# ------------------------------------------------------------------------------------------------

#: Comment prefix of the test's DOCKER-USER rules (stale ones of killed runs are removed by it).
GUARD_COMMENT_PREFIX = "specwatch-e2e egress guard "


def iptables_for_docker() -> tuple[str | None, str]:
    """The iptables binary whose DOCKER-USER chain is the one dockerd uses (the chain exists and
    FORWARD jumps to it), as ``(binary, "")``, or ``(None, one-line reason)`` when there is none
    (no iptables, not root, dockerd started with ``--iptables=false``)."""
    reasons = []
    for binary in ("iptables", "iptables-nft", "iptables-legacy"):
        try:
            res = subprocess.run([binary, "-w", "-S", "FORWARD"], capture_output=True, text=True, timeout=30)
        except FileNotFoundError:
            continue
        if res.returncode != 0:
            reasons.append(f"{binary} -S FORWARD: {res.stderr.strip().splitlines()[-1:] or res.returncode}")
            continue
        if "-j DOCKER-USER" in res.stdout:
            return binary, ""
        reasons.append(f"{binary}: FORWARD does not jump to DOCKER-USER")
    return None, "; ".join(reasons) or "no iptables binary on PATH"


def stale_guard_rules(binary: str) -> list[str]:
    """``-A DOCKER-USER ...`` lines of guard rules left by killed runs of this test."""
    out = subprocess.run([binary, "-w", "-S", "DOCKER-USER"], capture_output=True, text=True, timeout=30).stdout
    return [ln for ln in out.splitlines() if ln.startswith("-A DOCKER-USER") and GUARD_COMMENT_PREFIX.strip() in ln]


def remove_rule_line(binary: str, line: str) -> None:
    """Delete one rule given as an ``iptables -S`` line (``-A CHAIN spec...``)."""
    args = shlex.split(line)
    subprocess.run([binary, "-w", "-D", *args[1:]], capture_output=True, text=True, timeout=30)


def embedded_dns_upstreams(resolv_conf: Path = Path("/etc/resolv.conf")) -> list[str]:
    """The servers Docker's embedded DNS forwards unknown names to from inside a container's
    network namespace: the host's non-loopback IPv4 nameservers, or Docker's defaults 8.8.8.8 and
    8.8.4.4 when the host lists none. (Loopback nameservers of the host are asked from the host's
    own namespace: that traffic never crosses FORWARD.)"""
    servers = re.findall(r"^\s*nameserver\s+(\d+\.\d+\.\d+\.\d+)\s*$", resolv_conf.read_text(), re.M) if resolv_conf.exists() else []
    if not servers:
        return ["8.8.8.8", "8.8.4.4"]
    return [ip for ip in servers if not ip.startswith("127.")]


class EgressGuard:
    """The issue's network rule, enforced and counted while the stack runs: one rule at the top of
    Docker's DOCKER-USER chain (FORWARD) that DROPs every packet whose source is the project
    network's subnet and whose destination is outside it, with a comment naming the project.

    Containers still reach each other (same subnet), and the host reaches them through the
    published 127.0.0.1 ports: docker-proxy connects from the host to the container, which is the
    host's OUTPUT/INPUT path, not FORWARD (checked on this engine, docs/compose.md).

    Docker's embedded DNS (127.0.0.11 in each container) answers the project's own names; names it
    does not know (the compose Prometheus config's ``vllm-baseline`` and ``specwatch-bench``
    targets, whose services do not run) it forwards to the host's nameservers, and Docker 20.10
    does so from the container's own network namespace (libnetwork's resolver dials the server in
    the sandbox unless it is a host loopback address): packets from the project subnet to another
    address (checked on this engine: a lookup of ``vllm-baseline`` from a container on a test
    network sent two UDP packets to the host's nameserver through FORWARD). Rules ahead of the
    general DROP drop exactly those (udp/tcp port 53 to :func:`embedded_dns_upstreams`) and count
    them apart (``dns_packets()``): nothing of them leaves the host, and such a lookup fails after
    the client's resolver timeout (about 10 s for glibc's defaults) instead of with NXDOMAIN.

    ``packets()`` is the DROP rule's packet counter: each packet counted is one a container tried
    to send elsewhere, and was dropped.
    """

    def __init__(self, binary: str, subnets: list[str], project: str, dns_upstreams: list[str] | None = None):
        if not subnets:
            raise ValueError(f"project network of {project} has no IPv4 subnet")
        self.binary, self.subnets, self.project = binary, subnets, project
        self.dns_upstreams = embedded_dns_upstreams() if dns_upstreams is None else dns_upstreams
        self.comment = GUARD_COMMENT_PREFIX + project
        self.dns_comment = self.comment + " embedded-DNS forwards"
        self.installed: list[list[str]] = []

    def _specs(self, subnet: str) -> list[list[str]]:
        """The rules for one subnet, in chain order (the embedded DNS' forwards first, then all else)."""
        specs = []
        for up in self.dns_upstreams:
            for proto in ("udp", "tcp"):
                specs.append(["DOCKER-USER", "-s", subnet, "-d", up, "-p", proto, "--dport", "53",
                              "-m", "comment", "--comment", self.dns_comment, "-j", "DROP"])
        specs.append(["DOCKER-USER", "-s", subnet, "!", "-d", subnet, "-m", "comment", "--comment", self.comment, "-j", "DROP"])
        return specs

    def install(self) -> None:
        """Insert the rules at the top of DOCKER-USER. RuntimeError when iptables refuses."""
        for subnet in self.subnets:
            for spec in reversed(self._specs(subnet)):  # each goes to position 1: insert the last first
                res = subprocess.run([self.binary, "-w", "-I", spec[0], "1", *spec[1:]], capture_output=True, text=True, timeout=30)
                if res.returncode != 0:
                    raise RuntimeError(f"{self.binary} -I DOCKER-USER failed: {res.stderr.strip()}")
                self.installed.append(spec)

    def _count(self, comment: str) -> int:
        res = subprocess.run([self.binary, "-w", "-L", "DOCKER-USER", "-n", "-v", "-x"],
                             capture_output=True, text=True, timeout=30, check=True)
        rows = [ln.split() for ln in res.stdout.splitlines() if f"/* {comment} */" in ln]
        expected = sum(1 for spec in self.installed if comment in spec)
        if len(rows) != expected:
            raise AssertionError(f"expected {expected} rule(s) {comment!r} in DOCKER-USER, found {len(rows)}:\n{res.stdout}")
        return sum(int(r[0]) for r in rows)

    def packets(self) -> int:
        """Packets dropped so far by the DROP rule(s) (``iptables -L DOCKER-USER -v -x``)."""
        return self._count(self.comment)

    def dns_packets(self) -> int:
        """Packets of the embedded DNS' forwarded lookups dropped so far."""
        return self._count(self.dns_comment)

    def remove(self) -> None:
        """Delete the rule(s) again (idempotent)."""
        while self.installed:
            spec = self.installed.pop()
            subprocess.run([self.binary, "-w", "-D", *spec], capture_output=True, text=True, timeout=30)


def network_subnets(project: str) -> list[str]:
    """IPv4 subnets of the compose project's network(s) (``docker network inspect``)."""
    ids = docker("network", "ls", "-q", "--filter", f"label=com.docker.compose.project={project}").stdout.split()
    subnets = []
    for nid in ids:
        for cfg in json.loads(docker("network", "inspect", nid).stdout)[0]["IPAM"]["Config"] or []:
            if ":" not in cfg.get("Subnet", ":"):
                subnets.append(cfg["Subnet"])
    return subnets


# ------------------------------------------------------------------------------------------------
# ports, the machine-wide vLLM lock, traffic
# ------------------------------------------------------------------------------------------------


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Something listens on ``host:port`` now (:func:`specwatch.common.processes.listen_error`:
    a bind with SO_REUSEADDR, as the servers do, fails)."""
    return listen_error(host, port) is not None


def VllmLock(note: str, timeout: float = 2700.0) -> localvllm_server.VllmLock:
    """The machine-wide vLLM lock every real vLLM here holds, waiting at most ``timeout`` s; the
    lock file names this holder (``PID compose:PROJECT``) while held."""
    return localvllm_server.VllmLock(LOCK_PATH, timeout=timeout, note=note)


COPY_TEXT = ("The lighthouse keeper climbed the spiral stairs every evening at dusk. He wound the clockwork, "
             "trimmed the wick and polished the great lens until it shone, then sat by the window with his tea.")


def copy_completion(base_url: str, model: str, max_tokens: int = 64, timeout: float = 300.0) -> dict:
    """One greedy copy-like completion (ngram speculation drafts it well). Raises on HTTP errors."""
    prompt = f"Repeat the text below exactly, three times.\n\nText: {COPY_TEXT}\n\nCopy 1: {COPY_TEXT}\n\nCopy 2:"
    r = requests.post(base_url + "/v1/completions", timeout=timeout, json={
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True})
    r.raise_for_status()
    return r.json()


class BackgroundTraffic:
    """Copy completions one after another in a thread until stopped (or ``max_seconds``/
    ``max_requests``); failures (e.g. while the server restarts) are counted, not raised."""

    def __init__(self, base_url: str, model: str, max_seconds: float = 900.0, max_requests: int = 2000):
        self.base_url, self.model = base_url, model
        self.max_seconds, self.max_requests = max_seconds, max_requests
        self.ok = 0
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set() and time.monotonic() - t0 < self.max_seconds and self.ok + self.failed < self.max_requests:
            try:
                copy_completion(self.base_url, self.model, max_tokens=48, timeout=120)
                self.ok += 1
            except requests.RequestException:
                self.failed += 1
                self._stop.wait(1.0)

    def __enter__(self) -> BackgroundTraffic:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=180)


class ExporterMonitor:
    """Reads the exporter's /metrics every ``interval`` s in a thread (bounded by ``max_seconds``)
    and keeps, per read: time, ``specwatch_up``, the summed copies of vLLM's accepted / draft token
    counters, and every windowed ratio (``specwatch_draft_acceptance_rate``,
    ``specwatch_mean_acceptance_length``, ``specwatch_position_acceptance_rate``)."""

    RATIOS = ("specwatch_draft_acceptance_rate", "specwatch_mean_acceptance_length", "specwatch_position_acceptance_rate")

    def __init__(self, url: str, interval: float = 1.0, max_seconds: float = 1200.0):
        self.url, self.interval, self.max_seconds = url, interval, max_seconds
        self.reads: list[dict] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set() and time.monotonic() - t0 < self.max_seconds:
            try:
                text = requests.get(self.url, timeout=10).text
                up = metric_samples(text, "specwatch_up")
                self.reads.append({
                    "t": time.time(),
                    "up": up[0][1] if up else None,
                    "accepted": sum(v for _, v in metric_samples(text, "specwatch_accepted_tokens_total")),
                    "draft": sum(v for _, v in metric_samples(text, "specwatch_draft_tokens_total")),
                    "ratios": {n: metric_samples(text, n) for n in self.RATIOS},
                })
            except (requests.RequestException, ValueError):
                self.errors += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> ExporterMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


# ------------------------------------------------------------------------------------------------
# Prometheus' HTTP API and the exporter's text format
# ------------------------------------------------------------------------------------------------


def prom_get(prom_url: str, path: str, **params) -> dict:
    r = requests.get(prom_url + path, params=params, timeout=30)
    body = r.json()
    if r.status_code != 200 or body.get("status") != "success":
        raise AssertionError(f"{path} {params} -> {r.status_code} {body.get('errorType')}: {body.get('error')}")
    return body["data"]


def query(prom_url: str, expr: str, at: float | None = None) -> list[dict]:
    params = {"query": expr}
    if at is not None:
        params["time"] = at
    return prom_get(prom_url, "/api/v1/query", **params)["result"]


def query_range(prom_url: str, expr: str, start: float, end: float, step: str = "15s") -> list[dict]:
    return prom_get(prom_url, "/api/v1/query_range", query=expr, start=start, end=end, step=step)["result"]


def wait_for(what: str, fn, limit: float, interval: float = 3.0):
    """Call ``fn()`` until it returns something truthy (returned) or ``limit`` s pass
    (AssertionError naming ``what`` and the last value or exception)."""
    t0 = time.monotonic()
    last = None
    while True:
        try:
            last = fn()
            if last:
                return last
        except (requests.RequestException, AssertionError, ValueError, KeyError) as exc:
            last = exc
        if time.monotonic() - t0 > limit:
            raise AssertionError(f"{what}: not within {limit:.0f} s (last: {last!r})"[:3000])
        time.sleep(interval)


_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")


def rfc3339_seconds(text: str) -> float:
    """Prometheus' RFC 3339 timestamps (nanosecond fractions, ``Z`` or an offset) as Unix seconds.
    A target never scraped or a group never evaluated reads ``0001-01-01T00:00:00Z`` (far in the past)."""
    import datetime as dt

    m = _RFC3339.fullmatch(text)
    if not m:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    base = dt.datetime.fromisoformat(m.group(1) + m.group(3).replace("Z", "+00:00"))
    return base.timestamp() + float("0." + (m.group(2) or "0"))


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}"


def stale_targets(prom_url: str, since: float, jobs: Sequence[str], up: Sequence[str] = ()) -> tuple[dict, list[str]]:
    """One look at ``/api/v1/targets``: ({"job/instance": {"last_scrape", "scrape_end", "health"}} in
    Unix seconds, what is stale). Stale: a job of ``jobs`` without an active target, an active target
    of those jobs not scraped after ``since`` (a failed scrape counts: it happened), and an instance
    of ``up`` (``vllm:8000``) that is no target of those jobs or whose last scrape failed."""
    targets = prom_get(prom_url, "/api/v1/targets", state="active")["activeTargets"] if jobs else []
    seen: dict[str, dict] = {}
    stale: list[str] = []
    for job in jobs:
        mine = [t for t in targets if t["labels"].get("job") == job]
        if not mine:
            stale.append(f"job {job!r}: no active target")
        for t in mine:
            name = f"{job}/{t['labels'].get('instance')}"
            last = rfc3339_seconds(t["lastScrape"])
            seen[name] = {"last_scrape": last, "scrape_end": last + float(t.get("lastScrapeDuration") or 0),
                          "health": t["health"], "error": t.get("lastError") or ""}
            if last <= since:
                stale.append(f"target {name}: last scraped {_clock(last) if last > 0 else 'never'}")
    for instance in up:
        mine = [(n, s) for n, s in seen.items() if n.split("/", 1)[1] == instance]
        if not mine:
            stale.append(f"target {instance}: no active target of the jobs {list(jobs)}")
        stale += [f"target {n}: health {s['health']}" + (f" ({s['error']})" if s["error"] else "")
                  for n, s in mine if s["health"] != "up"]
    return seen, stale


def stale_groups(prom_url: str, after: float, groups: Sequence[str]) -> tuple[dict, list[str]]:
    """One look at ``/api/v1/rules``: ({group: last evaluation, Unix seconds}, what is stale). Stale: a
    group of ``groups`` that Prometheus has not loaded or did not evaluate after ``after``."""
    got = {g["name"]: g for g in prom_get(prom_url, "/api/v1/rules")["groups"]} if groups else {}
    seen: dict[str, float] = {}
    stale: list[str] = []
    for name in groups:
        g = got.get(name)
        if g is None:
            stale.append(f"rule group {name!r}: not loaded")
            continue
        last = rfc3339_seconds(g["lastEvaluation"]) if g.get("lastEvaluation") else 0.0
        seen[name] = last
        if last <= after:
            stale.append(f"rule group {name!r}: last evaluated {_clock(last) if last > 0 else 'never'}")
    return seen, stale


def wait_for_fresh_scrape_and_eval(prom_url: str, since: float, *, jobs: Sequence[str] = (), groups: Sequence[str] = (),
                                   up: Sequence[str] = (), timeout: float = 60.0, interval: float = 0.5) -> dict:
    """Wait until Prometheus has scraped every active target of ``jobs`` after ``since`` (Unix
    seconds, taken just before: e.g. once the last values to be stored were produced), the last
    scrape of each instance of ``up`` succeeded, and every rule group of ``groups`` was evaluated
    after those scrapes had ended (so the evaluation saw them; without ``jobs``: after ``since``).
    What a fixed sleep of "one more scrape and rule evaluation" meant.

    Returns ``{"targets": …, "groups": …}`` as last seen (:func:`stale_targets`, :func:`stale_groups`)
    and ``"rules_after"``: the end of the first fresh scrapes seen, which every group's evaluation
    followed (the targets' own times may be later: Prometheus went on scraping).
    Raises AssertionError naming every stale target and group (or the API's last error) after
    ``timeout`` s."""
    state: dict[str, Any] = {"stale": ["not looked at yet"], "seen": {}, "evaluated_after": None}

    def fresh() -> bool:
        try:
            targets, stale = stale_targets(prom_url, since, jobs, up)
            if not stale and state["evaluated_after"] is None:
                # fixed at the first fresh scrapes seen: the later scrapes must not move it
                state["evaluated_after"] = max([since, *(t["scrape_end"] for t in targets.values())])
            evaluated, late = stale_groups(prom_url, state["evaluated_after"] or since, groups)
        except (requests.RequestException, AssertionError, ValueError, KeyError) as exc:
            state["stale"] = [f"Prometheus API: {exc!r}"[:500]]
            return False
        state["seen"] = {"targets": targets, "groups": evaluated, "rules_after": state["evaluated_after"]}
        state["stale"] = stale + late
        return not state["stale"]

    if polling.wait_until(fresh, timeout, interval):
        return state["seen"]
    rules = "" if state["evaluated_after"] is None else f" (rules: after the scrapes ended, {_clock(state['evaluated_after'])})"
    raise AssertionError(f"Prometheus {prom_url}: not scraped and evaluated after {_clock(since)}{rules} within "
                         f"{timeout:g} s: " + "; ".join(state["stale"]))


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Samples of metric ``name`` in Prometheus text exposition ``text`` (prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out.append((dict(s.labels), float(s.value)))
    return out


# Moved from tests/e2e/test_compose_e2e.py (its live check of the dashboards uses them).
# (dashboard, panel title) -> why it may stay empty in the composed cpu stack.
_NO_PROFILE = ("needs a cost profile measured on this hardware (specwatch calibrate; the exporter's --cost-profile) "
               "or a baseline server beside the speculative one: the compose file ships neither by design, since "
               "another machine's profile would turn a guess into a live (measured or calibrated) speedup (docs/cost.md)")
EXPECTED_EMPTY = {
    ("load-test.json", "Measured speedup by concurrency"):
        "needs a baseline (no speculation) server beside the speculative one; the cpu profile runs one "
        "CPU vLLM (2 cores) and no baseline",
    ("speculative-decoding.json", "Live speedup at the current k"): _NO_PROFILE,
    ("speculative-decoding.json", "Live speedup at the current k over time"): _NO_PROFILE,
    ("speculative-decoding.json", "Method and drafter"):
        "comes from the exporter's --upstream ...,method=,drafter= options or --speculative-method/--drafter (vLLM's "
        "/metrics does not say which method runs); the compose file leaves them unset",
    ("speculative-decoding.json", "SGLang: mean acceptance length by model"):
        "reads SGLang's request-finish counters (specwatch_sglang_*, schema sglang); the upstream here is vLLM",
    ("speculative-decoding.json", "SGLang: spec_accept_rate gauge (per rank)"):
        "passes through SGLang's sglang:spec_accept_rate gauge (schema sglang); the upstream here is vLLM",
}
# Any query target with this selector may be empty too: it reads the baseline (no speculation)
# server, which the cpu profile does not run. Both exceptions are listed in docs/compose.md
# (tests/integration/test_compose.py checks that the page names every EXPECTED_EMPTY entry).
BASELINE_SELECTOR = 'role="baseline"'
