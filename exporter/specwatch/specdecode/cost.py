"""The coefficient guess c(k, b) = 1 + k (a + s b) as a model object: the prior of the sweep's
step-cost fit.

The formula and its two default coefficients are :mod:`specwatch.specdecode.costprofile`'s
(:func:`~specwatch.specdecode.costprofile.guess_cost_ratio`, ``DEFAULT_COST_PER_DRAFT_TOKEN…``);
the tie rule is :mod:`specwatch.specdecode.decision`'s. This module wraps them for the k-choice
model (:mod:`specwatch.choosek.model`): :class:`CostModel` (the coefficients, validated),
:func:`step_cost_factor`, :func:`estimated_speedup(s) <estimated_speedups>` and
:func:`recommend_k`. The model fits per-cell step costs from a sweep's own measurements and uses
the guess only as the prior of that fit, for k that were not run. Live speedups, alerts and
dashboards never use this module: they read measured step times from a cost profile
(:mod:`specwatch.specdecode.speedup`; without a profile they show the same guess labelled
``basis="default"``).

    c(k, b) = verify step time / plain step time = 1 + k × (a + s × b)

with k draft tokens per draft and b running requests per engine. a = 0.05 per draft token (a
9-token verify step took 1.4× a plain step on a laptop GPU at concurrency 1) and s = 0.02 per
draft token and running request (the published k = 4 copy speedups at concurrency 8 and 32); see
docs/cost.md for why this is a guess and not an answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from specwatch.specdecode.costprofile import (DEFAULT_COST_PER_DRAFT_TOKEN, DEFAULT_COST_PER_DRAFT_TOKEN_PER_RUNNING_REQUEST,
                                             guess_cost_ratio)
from specwatch.specdecode.decision import TOLERANCE, Candidate, decide
from specwatch.specdecode.derive import expected_lengths

DEFAULT_STEP_COST_PER_DRAFT_TOKEN = DEFAULT_COST_PER_DRAFT_TOKEN
DEFAULT_STEP_COST_PER_DRAFT_TOKEN_PER_RUNNING_REQUEST = DEFAULT_COST_PER_DRAFT_TOKEN_PER_RUNNING_REQUEST


class CostCoefficients(Protocol):
    """Anything carrying the two cost-model coefficients (CostModel)."""

    step_cost_per_draft_token: float
    step_cost_per_draft_token_per_running_request: float


@dataclass(frozen=True)
class CostModel:
    """The two coefficients of c(k, b), each a fraction of a plain decode step's time.

    Raises ValueError if either is negative or not finite.
    """

    step_cost_per_draft_token: float = DEFAULT_STEP_COST_PER_DRAFT_TOKEN
    step_cost_per_draft_token_per_running_request: float = (
        DEFAULT_STEP_COST_PER_DRAFT_TOKEN_PER_RUNNING_REQUEST
    )

    def __post_init__(self) -> None:
        validate_coefficients(self)


def validate_coefficients(cfg: CostCoefficients) -> None:
    """Raise ValueError unless both coefficients of ``cfg`` are finite and ≥ 0."""
    for name in ("step_cost_per_draft_token", "step_cost_per_draft_token_per_running_request"):
        value = getattr(cfg, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{name} must be a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def step_cost_factor(k: float, running_requests: float, cfg: CostCoefficients | None = None) -> float:
    """Cost of one verify step relative to a plain decode step: c(k, b) ≥ 1.

    Args:
        k: draft tokens per verify step (effective k = Δdraft_tokens / Δdrafts, or the configured
           num_speculative_tokens); a non-negative float.
        running_requests: running requests per engine (vllm:num_requests_running), ≥ 0; may be a
           time average, so a float.
        cfg: the coefficients (a CostModel); defaults to CostModel().

    Returns: 1 + k × (step_cost_per_draft_token + step_cost_per_draft_token_per_running_request × b).

    Raises: ValueError if k or running_requests is negative or not finite.
    """
    if cfg is None:
        cfg = CostModel()
    for name, value in (("k", k), ("running_requests", running_requests)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return guess_cost_ratio(k, running_requests, cfg.step_cost_per_draft_token,
                            cfg.step_cost_per_draft_token_per_running_request)


def estimated_speedup(
    mean_acceptance_length: float,
    k: float,
    running_requests: float,
    cfg: CostCoefficients | None = None,
) -> float:
    """Estimated speedup of speculation over plain decoding: mean acceptance length / c(k, b).

    Args:
        mean_acceptance_length: tokens per verify step, bonus included (1 + Δaccepted / Δdrafts), ≥ 1
           in practice; for a what-if k′ pass the expected acceptance length E(k′) = 1 + Σ_{i<k′} r_i.
        k, running_requests, cfg: as for step_cost_factor.

    Raises: ValueError as step_cost_factor, or if mean_acceptance_length is negative / not finite.
    """
    if not math.isfinite(mean_acceptance_length) or mean_acceptance_length < 0:
        raise ValueError(
            f"mean_acceptance_length must be a finite number >= 0, got {mean_acceptance_length!r}"
        )
    return mean_acceptance_length / step_cost_factor(k, running_requests, cfg)

def estimated_speedups(
    rates: tuple[float, ...], running_requests: float, cost: CostModel
) -> dict[int, float]:
    """Estimated speedup for every k' = 0 … len(rates): E(k') / c(k', b); ``{0: 1.0, 1: …}``.

    ``rates`` are unconditional per-position acceptance rates r_i (0–1) of a chain drafter at
    the largest k; ``running_requests`` is b (``vllm:num_requests_running`` per engine, ≥ 0).
    Cost model: :func:`specwatch.specdecode.cost.step_cost_factor` (shared with the recording rules).
    """
    out = {0: 1.0}
    for k, e in enumerate(expected_lengths(rates), start=1):
        out[k] = e / step_cost_factor(k, running_requests, cost)
    return out


def recommend_k(speedups: dict[int, float], tolerance: float = TOLERANCE) -> int:
    """The k to run from point speedups (k → ratio over no speculation, > 0) by the one decision
    rule (:func:`specwatch.specdecode.decision.decide`: the best estimate, the smallest k within
    ``tolerance``; off, k = 0 at exactly 1, always competes). Raises ValueError for a speedup that
    is not a finite number > 0 or a tolerance outside [0, 1)."""
    return decide([Candidate(f"k={k}", int(k), float(v), basis="default") for k, v in speedups.items() if k > 0],
                  tolerance).k
