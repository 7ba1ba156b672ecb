"""Choosing k: the verify-step cost model and the speedup it predicts from a per-position curve.

Cost model (defaults from the seed measurements, ``shared/workloads.md``):

    c(k, b) = 1 + k × (a + s × b)     (see :mod:`specwatch.costmodel` for a, s and their source)

Estimated speedup at k' = E(k') / c(k', b), with E(k') = 1 + Σ_(i<k') r_i from the per-position
curve (:func:`specwatch.derive.expected_lengths`); k' = 0 (speculation off) is 1 by definition.
This is vLLM's recipe for its dynamic table, k*(b) = argmax_k E(k) / ITL(b, k), with ITL
modelled by c(k, b).
"""

from __future__ import annotations

from specwatch.costmodel import CostModel, step_cost_factor
from specwatch.derive import expected_lengths

__all__ = ["CostModel", "estimated_speedups", "recommend_k", "step_cost_factor"]


def estimated_speedups(
    rates: tuple[float, ...], running_requests: float, cost: CostModel
) -> dict[int, float]:
    """Estimated speedup for every k' = 0 … len(rates): E(k') / c(k', b); ``{0: 1.0, 1: …}``.

    ``rates`` are unconditional per-position acceptance rates r_i (0–1) of a chain drafter at
    the largest k; ``running_requests`` is b (``vllm:num_requests_running`` per engine, ≥ 0).
    Cost model: :func:`specwatch.costmodel.step_cost_factor` (shared with the recording rules).
    """
    out = {0: 1.0}
    for k, e in enumerate(expected_lengths(rates), start=1):
        out[k] = e / step_cost_factor(k, running_requests, cost)
    return out


def recommend_k(speedups: dict[int, float], tolerance: float = 0.02) -> int:
    """The k with the highest estimated speedup, preferring the smallest k within ``tolerance``
    (relative) of the best, so noise does not buy extra draft tokens; 0 means speculation off."""
    if not speedups:
        raise ValueError("no speedups to choose from")
    best = max(speedups.values())
    return min(k for k, v in speedups.items() if v >= best * (1.0 - tolerance))
