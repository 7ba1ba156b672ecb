"""Measure a drafter's acceptance on the embedded real vLLM (``method: draft_model``).

:func:`measure_drafter` starts the embedded vLLM with the drafter at k, sends a fixed, greedy set
of natural-text completions (:data:`PROMPTS`, ``ignore_eos``), and reads the spec-decode counters
before and after: draft acceptance rate = Δ``vllm:spec_decode_num_accepted_tokens_total`` /
Δ``…_num_draft_tokens_total``; per-position acceptance r_i = Δ``…_per_pos_total{position=i}`` /
Δ``…_num_drafts_total``; mean acceptance length = 1 + Δaccepted / Δdrafts. Greedy decoding of
fixed prompts with a seeded drafter makes the figure reproducible up to batching effects (the
CPU kernels' reductions depend on the batch, so a few tokens can differ between runs).
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from specwatch.localvllm.drafters import draft_model_config
from specwatch.localvllm.server import DEFAULT_SERVED_MODEL_NAME, VllmServer
from specwatch.specdecode.derive import counters_delta, derive
from specwatch.specdecode.metrics import parse_metrics

#: Natural-text completion prompts (our own), the workload of the acceptance figures.
PROMPTS: tuple[str, ...] = (
    "The history of the bicycle begins in the early nineteenth century, when",
    "Here are three tips for keeping houseplants healthy. First,",
    "The train was late again, so Maria decided to walk to the office. On the way she",
    "A good cup of coffee depends on three things: the beans, the water and",
    "In this short guide we explain how a refrigerator keeps food cold. The key idea is",
    "Dear neighbours, we are writing to let you know that the street will be closed next week because",
)


@dataclass(frozen=True)
class DrafterMeasurement:
    """Acceptance of one drafter at k on the embedded vLLM (all measured from vLLM's counters):
    ``acceptance_rate`` (0–1), ``position_rates`` (r_0 … r_(k-1)), ``mean_acceptance_length``
    (tokens per verify step), ``drafts``, ``output_tokens_per_second`` (client wall clock)."""

    drafter: str
    k: int
    acceptance_rate: float
    position_rates: tuple[float, ...]
    mean_acceptance_length: float
    drafts: float
    output_tokens_per_second: float


def _counters(url: str):
    snap = parse_metrics(requests.get(url, timeout=30).text)
    c = list(snap.counters.values())
    if not c:
        raise RuntimeError("the server exports no spec-decode counters")
    return c[0]


def _send(base_url: str, n: int, concurrency: int, max_tokens: int) -> int:
    def one(i: int) -> int:
        body = {"model": DEFAULT_SERVED_MODEL_NAME, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens,
                "temperature": 0.0, "ignore_eos": True}
        r = requests.post(base_url + "/v1/completions", json=body, timeout=600)
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        return sum(pool.map(one, range(n)))


def measure_drafter(label: str, path: Path | str, k: int = 3, *, port: int, n: int = 6, concurrency: int = 3,
                    max_tokens: int = 64, log_path: Path | str | None = None) -> DrafterMeasurement:
    """Start the embedded vLLM serving ``method: draft_model`` with the drafter at ``path`` and k,
    warm up with one batch, measure ``n`` completions of ``max_tokens`` tokens at ``concurrency``,
    and return the :class:`DrafterMeasurement`. Holds the machine-wide vLLM lock while it runs.

    Raises :class:`~specwatch.localvllm.server.VllmStartError`, ``requests`` errors, RuntimeError."""
    with VllmServer(port, speculative_config=draft_model_config(path, k), log_path=log_path) as srv:
        _send(srv.base_url, concurrency, concurrency, 16)  # warm-up
        before = _counters(srv.metrics_url)
        t0 = time.monotonic()
        tokens = _send(srv.base_url, n, concurrency, max_tokens)
        dt = time.monotonic() - t0
        after = _counters(srv.metrics_url)
    d = derive(counters_delta(before, after))  # vLLM's formulas, one owner (specdecode.derive)
    if d.draft_acceptance_rate is None or d.mean_acceptance_length is None:
        raise RuntimeError(f"drafter {label}: no drafts during the measurement ({n} completions of {max_tokens} tokens); "
                           "nothing to measure")
    drafts = (after.drafts or 0) - (before.drafts or 0)
    return DrafterMeasurement(label, k, d.draft_acceptance_rate, d.position_acceptance_rates, d.mean_acceptance_length,
                              drafts, tokens / dt)
