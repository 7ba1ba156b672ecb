"""Choosing k: the verify-step cost model and the speedup it predicts from a per-position curve.

Cost model (defaults from the seed measurements, ``shared/workloads.md``):

    c(k, b) = 1 + k × (a + s × b)

is the time of one verify step carrying k draft tokens, relative to a plain decode step, with
``b`` requests running in the batch. ``a`` = 0.05 per draft token: one step verifying 9 tokens
took 1.4× a plain step at concurrency 1 (7.8 ms vs 5.7 ms → 0.4 / 8). ``s`` = 0.02 per draft
token and running request: the k=4 copy speedups at concurrency 8 (2.54×) and 32 (1.41×) with
≈4.8 tokens per step imply a ≈ 0.05 + 0.02 b.

Estimated speedup at k' = E(k') / c(k', b), with E(k') = 1 + Σ_(i<k') r_i from the per-position
curve (:func:`specwatch.derive.expected_lengths`); k' = 0 (speculation off) is 1 by definition.
This is vLLM's recipe for its dynamic table, k*(b) = argmax_k E(k) / ITL(b, k), with ITL
modelled by c(k, b).
"""

from __future__ import annotations

from dataclasses import dataclass

from specwatch.derive import expected_lengths


@dataclass(frozen=True)
class CostModel:
    """Verify-step cost factor coefficients (see module docstring); both ≥ 0."""

    per_draft_token: float = 0.05
    per_draft_token_per_running_request: float = 0.02

    def step_cost_factor(self, k: float, running_requests: float) -> float:
        """c(k, b) = 1 + k × (a + s × b): verify-step time relative to a plain step (≥ 1)."""
        b = max(running_requests, 1.0)
        return 1.0 + k * (self.per_draft_token + self.per_draft_token_per_running_request * b)


def estimated_speedups(
    rates: tuple[float, ...], running_requests: float, cost: CostModel
) -> dict[int, float]:
    """Estimated speedup for every k' = 0 … len(rates): E(k') / c(k', b); ``{0: 1.0, 1: …}``.

    ``rates`` are unconditional per-position acceptance rates r_i (0–1) of a chain drafter at
    the largest k; ``running_requests`` is b (``vllm:num_requests_running``, at least 1 is used).
    """
    out = {0: 1.0}
    for k, e in enumerate(expected_lengths(rates), start=1):
        out[k] = e / cost.step_cost_factor(k, running_requests)
    return out


def recommend_k(speedups: dict[int, float], tolerance: float = 0.02) -> int:
    """The k with the highest estimated speedup, preferring the smallest k within ``tolerance``
    (relative) of the best, so noise does not buy extra draft tokens; 0 means speculation off."""
    if not speedups:
        raise ValueError("no speedups to choose from")
    best = max(speedups.values())
    return min(k for k, v in speedups.items() if v >= best * (1.0 - tolerance))
