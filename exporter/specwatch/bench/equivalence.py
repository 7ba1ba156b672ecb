"""Greedy-output equivalence check between a baseline and a speculative server.

Speculative decoding is lossless in exact arithmetic, so greedy outputs should match the
baseline's; in practice the verify step's different batch shapes change floating-point results and
outputs can diverge (the seed saw 10/12 identical on vLLM 0.31, 12/12 on 0.32). The check sends
fixed prompts (6 copy + 6 word-chain, greedy, 128 tokens with ``ignore_eos`` — the seed's) one at a
time to each server (concurrency 1, so batch composition cannot differ between servers), then
compares the generated texts character by character.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from specwatch.bench.backend import OpenAIBackend, RequestOutcome
from specwatch.bench.workloads import BenchRequest, equivalence_requests


def first_difference(a: str, b: str) -> int | None:
    """Index of the first character where ``a`` and ``b`` differ; ``min(len)`` when one is a
    strict prefix of the other; None when identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    if len(a) != len(b):
        return min(len(a), len(b))
    return None


@dataclass(frozen=True)
class PromptComparison:
    """One prompt's result. ``identical`` is False also when either request failed (``error``)."""

    name: str
    identical: bool
    first_difference: int | None
    baseline_chars: int
    speculative_chars: int
    error: str | None = None

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name, "identical": self.identical, "first_difference": self.first_difference,
            "baseline_chars": self.baseline_chars, "speculative_chars": self.speculative_chars,
            "error": self.error,
        }


def compare_outputs(requests: Sequence[BenchRequest], baseline: Sequence[RequestOutcome],
                    speculative: Sequence[RequestOutcome]) -> dict[str, Any]:
    """Compare outcomes pairwise; returns ``{"matched", "total", "prompts": [...]}`` (JSON-ready)."""
    prompts = []
    for req, b, s in zip(requests, baseline, speculative):
        name = f"{req.workload}-{req.index}"
        err = "; ".join(f"{role}: {o.error}" for role, o in (("baseline", b), ("speculative", s)) if not o.success)
        if err:
            prompts.append(PromptComparison(name, False, None, len(b.generated_text), len(s.generated_text), err))
            continue
        pos = first_difference(b.generated_text, s.generated_text)
        prompts.append(PromptComparison(name, pos is None, pos, len(b.generated_text), len(s.generated_text)))
    return {
        "matched": sum(p.identical for p in prompts),
        "total": len(prompts),
        "prompts": [p.record() for p in prompts],
    }


async def run_sequential(backend: OpenAIBackend, requests: Sequence[BenchRequest]) -> list[RequestOutcome]:
    """Send ``requests`` one after another (concurrency 1)."""
    return [await backend.send(r) for r in requests]


async def check_equivalence(baseline: OpenAIBackend, speculative: OpenAIBackend, *,
                            output_len: int = 128, count_per_kind: int = 6, seed: int = 0) -> dict[str, Any]:
    """Run the fixed greedy prompts on the baseline, then on the speculative server (never both
    at once), and compare (see :func:`compare_outputs`). Request failures are reported per
    prompt, never raised."""
    reqs = equivalence_requests(output_len=output_len, count_per_kind=count_per_kind, seed=seed)
    base = await run_sequential(baseline, reqs)
    spec = await run_sequential(speculative, reqs)
    result = compare_outputs(reqs, base, spec)
    result["output_len"] = output_len
    return result
