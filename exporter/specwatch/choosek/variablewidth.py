"""Advice under variable draft width: tier-boundary warnings and the other engines' formats.

A batch-size → k table (vLLM's ``num_speculative_tokens_per_batch_size``, inclusive ranges
``[start_bs, end_bs, k]``; :func:`specwatch.choosek.model.dynamic_schedule`) is keyed by the raw
number of scheduled requests. At a concurrency c the engine sees c ± the requests joining (their
prefill) and leaving, so when a tier boundary lies near c, k flips from step to step: the draft
length changes, the per-position counters turn ragged, and when one side is k = 0 the server
switches between speculative and plain steps (vllm#49548 lost up to 10× throughput that way).

:func:`tier_boundary_warnings` flags every boundary within ±25 % of a measured concurrency
(at least c − 1 … c + 1: one prefill joining or one request finishing).

The same table in the other engines' formats (each follows the version named; check yours):

- **SGLang** ``--speculative-adaptive --speculative-adaptive-config FILE`` (batch-size-aware
  adaptive steps, sgl-project/sglang PR #24055, merged 2026-05;
  ``python/sglang/srt/speculative/adaptive_spec_params.py``): a JSON object whose integer-string
  keys are the *smallest* batch size of a slot, each ``{"candidate_steps": [...]}``; a batch uses
  the slot with the largest key ≤ its batch size (after padding to the CUDA-graph batch size).
  Pinning one value per slot (``[k]``) turns the adaptive controller into the fixed table;
  ``[0]`` drafts nothing. Only EAGLE / EAGLE3 / NEXTN with topk = 1, where
  ``speculative_num_steps`` = draft tokens per round = k. (The flat format of earlier releases,
  ``{"candidate_steps": [...], "ema_alpha": …}`` without batch sizes, is not produced.)
- **TensorRT-LLM** ``speculative_config.draft_len_schedule`` (LLM API, PyTorch backend; format of
  NVIDIA/TensorRT-LLM PR #10860, merged 2026-03-13, ``tensorrt_llm/llmapi/llm_args.py``): a map
  batch size → draft length whose keys are the *largest* batch size of a tier (``{4: 4, 8: 2,
  32: 1}``: 1–4 → 4, 5–8 → 2, 9–32 → 1, above 32 → 0, speculation off); ``max_draft_len`` is the
  largest draft length. Mutually exclusive with ``max_concurrency``. Releases before that PR read
  the same dict with keys as the *smallest* batch size of a tier (``bisect_right``: the largest
  key ≤ the batch size, the last length kept above the last key): only the PR #10860 form is
  produced (docs/ragged-drafts.md).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

#: A tier boundary within this fraction of a measured concurrency is warned about.
BOUNDARY_MARGIN = 0.25

SGLANG_FORMAT_VERSION = "sgl-project/sglang PR #24055 (batch-size-aware adaptive steps, merged 2026-05)"
TRTLLM_FORMAT_VERSION = "NVIDIA/TensorRT-LLM PR #10860 (draft_len_schedule, merged 2026-03-13)"


def k_at(table: Sequence[Sequence[int]], batch_size: int) -> int:
    """k of ``batch_size`` in a vLLM table (the last range's k carries on above its end, as vLLM
    does up to max_num_seqs; 0 below the first range)."""
    for s, e, k in table:
        if s <= batch_size <= e:
            return int(k)
    if table and batch_size > table[-1][1]:
        return int(table[-1][2])
    return 0


def tier_boundary_warnings(table: Sequence[Sequence[int]], concurrencies: Iterable[int],
                           margin: float = BOUNDARY_MARGIN) -> list[dict[str, Any]]:
    """Boundaries of ``table`` where k changes within ±``margin`` of a measured concurrency c
    (batch sizes ⌊(1 − margin) c⌋ … ⌈(1 + margin) c⌉, at least c − 1 … c + 1).

    Returns one dict per (concurrency, boundary): ``concurrency``, ``boundary`` (the last batch
    size of the lower tier), ``k_below``, ``k_above``, ``speculation_off`` (one side is k = 0)
    and ``message``. Empty for a table with one tier.
    """
    out = []
    for c in sorted(set(int(x) for x in concurrencies)):
        lo = max(1, min(c - 1, math.floor((1 - margin) * c)))
        hi = max(c + 1, math.ceil((1 + margin) * c))
        for i in range(len(table) - 1):
            end = int(table[i][1])
            k1, k2 = int(table[i][2]), k_at(table, end + 1)
            if k1 == k2 or not (lo <= end < hi):
                continue
            off = k1 == 0 or k2 == 0
            msg = (f"tier boundary at {end}/{end + 1} running requests (k {k1} → {k2}) is within ±{margin:.0%} of "
                   f"the measured concurrency {c}: vLLM keys k by the scheduled requests, so a prefill joining or a "
                   f"request finishing flips k from step to step"
                   + ("; one side turns speculation off, the costliest flip (vllm#49548)" if off else ""))
            out.append({"concurrency": c, "boundary": end, "k_below": k1, "k_above": k2,
                        "speculation_off": off, "message": msg})
    return out


def sglang_adaptive_config(table: Sequence[Sequence[int]]) -> dict[str, dict[str, list[int]]]:
    """SGLang's batch-size-keyed ``speculative_adaptive_config`` JSON for a vLLM table: one slot per
    tier keyed by its first batch size, ``candidate_steps`` pinned to the tier's k (module doc)."""
    return {str(int(s)): {"candidate_steps": [int(k)]} for s, _e, k in table}


def trtllm_draft_len_schedule(table: Sequence[Sequence[int]], max_batch_size: int | None = None) -> dict[str, Any]:
    """TensorRT-LLM's ``draft_len_schedule`` (keys = the largest batch size of each tier) and
    ``max_draft_len`` for a vLLM table. vLLM carries the last k above the table's end; TensorRT-LLM
    turns speculation off there, so the last tier is extended to ``max_batch_size`` when given
    (else ``note`` says so). Trailing k = 0 tiers are left implicit."""
    rows = [[int(s), int(e), int(k)] for s, e, k in table]
    while rows and rows[-1][2] == 0:
        rows.pop()
    note = None
    if rows and max_batch_size is not None and max_batch_size > rows[-1][1] and rows[-1] == [int(x) for x in table[-1]]:
        rows[-1][1] = int(max_batch_size)
    elif rows and rows[-1] == [int(x) for x in table[-1]]:
        note = (f"above batch size {rows[-1][1]} TensorRT-LLM turns speculation off (vLLM keeps k = {rows[-1][2]}); "
                "raise the last key to your max_batch_size to keep it")
    sched = {str(e): k for _s, e, k in rows}
    return {"draft_len_schedule": sched, "max_draft_len": max((k for *_x, k in rows), default=0), "note": note}


def engine_formats(cfg: dict[str, Any] | None, concurrencies: Iterable[int]) -> dict[str, Any] | None:
    """Everything :mod:`specwatch.choosek.advise` prints beside vLLM's config: the tier warnings,
    SGLang's and TensorRT-LLM's formats with the versions they follow. None without a table."""
    table = (cfg or {}).get("num_speculative_tokens_per_batch_size")
    if not table:
        return None
    return {"tier_warnings": tier_boundary_warnings(table, concurrencies),
            "sglang": {"format": SGLANG_FORMAT_VERSION, "speculative_adaptive_config": sglang_adaptive_config(table),
                       "flags": "--speculative-adaptive --speculative-adaptive-config FILE (EAGLE/EAGLE3/NEXTN, topk 1)"},
            "tensorrt_llm": {"format": TRTLLM_FORMAT_VERSION, **trtllm_draft_len_schedule(table)}}


__all__ = ["BOUNDARY_MARGIN", "engine_formats", "k_at", "sglang_adaptive_config", "tier_boundary_warnings",
           "trtllm_draft_len_schedule"]
