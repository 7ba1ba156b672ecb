"""One measured cell of the k-choice pipeline: :class:`Measurement`, built from the load
generator's typed cell summary (:class:`specwatch.bench.records.BenchCell`), with the derived
quantities the maths of :mod:`specwatch.choosek.model` uses (request-steps, tokens per step,
throughput-equivalent step time, the throughput interval)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from specwatch.bench.records import BenchCell
from specwatch.bench.results import throughput_interval


class KChoiceError(ValueError):
    """Inputs the advice cannot use (message says which and why)."""


@dataclass(frozen=True)
class BatchPoint:
    """One measured (non-warm-up) batch of a cell, the unit of pairing: ``index`` is the
    batch's ``batch_index`` (warm-ups counted; the position among the measured batches when the
    file has no batch records), ``throughput`` its output throughput (tok/s), ``num_prompts`` the
    requests it sent and ``seed`` the run seed its prompts were drawn with
    (:func:`specwatch.bench.workloads.requests_for_batch`: batch i of every configuration at the
    same workload, seed and number of prompts served the same prompts). ``accepted_tokens``: the
    batch's accepted draft tokens (None: not recorded)."""

    index: int
    throughput: float
    num_prompts: float | None = None
    seed: Any = None
    accepted_tokens: float | None = None

    def pairs_with(self, other: "BatchPoint") -> bool:
        """Both batches served the same seeded prompts: same index, seed and number of prompts."""
        return self.index == other.index and self.seed == other.seed and self.num_prompts == other.num_prompts


def _f(v: float | None) -> float | None:
    """A record's number as a float (None stays None)."""
    return None if v is None else float(v)


@dataclass(frozen=True)
class Measurement:
    """One measured cell: a server configuration (``config``, k = num_speculative_tokens, 0 for the
    baseline, ``family`` = the speculative config without its k, "" for the baseline) × workload ×
    concurrency.

    Throughputs in output tokens/s; TPOT/TTFT in ms; counts are deltas of the server's counters
    over the measured batches (``generation_tokens`` falls back to the client's output tokens).
    """

    config: str
    k: int
    workload: str
    concurrency: int
    output_throughput: float
    family: str = ""
    batch_throughputs: tuple[float, ...] = ()
    prompts_per_batch: float | None = None
    mean_tpot_ms: float | None = None
    mean_ttft_ms: float | None = None
    acceptance_length: float | None = None
    acceptance_rate: float | None = None  # 0-1
    position_rates: tuple[float, ...] = ()
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    generation_tokens: float | None = None
    #: Measured by the server over the cell (vLLM's ITL/iteration histograms,
    #: :mod:`specwatch.specdecode.steptime`): mean step time (ms), running requests per step, and
    #: a running request's decode speed (tok/s); None when the server does not export them.
    server_step_duration_ms: float | None = None
    server_running_requests: float | None = None
    server_request_decode_tokens_per_second: float | None = None
    mean_itl_ms: float | None = None
    #: How ``position_rates`` was obtained: ``exact_per_request`` (vLLM's per-request per-step
    #: arrays, :mod:`specwatch.bench.perrequest`; preferred when the cell has them), ``exact``
    #: (counters, every draft full) or ``lower_bound`` (counters, ragged drafts:
    #: :mod:`specwatch.specdecode.ragged`); never used to predict other k when ``lower_bound``.
    curve_basis: str = "exact"
    #: The counter-based curve, kept beside an exact per-request one (same as position_rates otherwise).
    counter_position_rates: tuple[float, ...] = ()
    #: The cell's drafts were ragged (counter basis lower_bound): its mean acceptance length is not
    #: the length at k (e.g. a dynamic table ran a smaller k), so it is not compared with E(k).
    ragged_drafts: bool = False
    #: The server ran a dynamic table (``num_speculative_tokens_per_batch_size``): k is only the
    #: table's largest width, so the run's throughput is not the throughput of a fixed k. (A fixed-k
    #: server whose drafts were short — ngram without a full match, drafts clipped at the end of an
    #: output — is still the server at that k: its throughput stays the measured value at k.)
    variable_width: bool = False
    #: The measured batches with their pairing keys (:class:`BatchPoint`; empty: only the
    #: summary's per-batch throughputs are known, see :attr:`batch_points`).
    batches: tuple[BatchPoint, ...] = ()
    #: The dynamic table (``num_speculative_tokens_per_batch_size``) of a variable-width
    #: configuration, as ``((start_bs, end_bs, k), …)``; None for a fixed k.
    table: tuple[tuple[int, ...], ...] | None = None
    #: A paired sweep cell (issue #37): the baseline's measured batches served beside this
    #: configuration, back to back with batch i of its own (the pairing partner of every batch);
    #: empty for a sequential cell (pair with the baseline's own cell).
    paired_baseline: tuple[BatchPoint, ...] = ()

    @property
    def batch_points(self) -> tuple[BatchPoint, ...]:
        """The measured batches to pair: :attr:`batches` when recorded, else the summary's
        per-batch throughputs by position (index 0, 1, … among measured batches, seed unknown)."""
        if self.batches:
            return self.batches
        return tuple(BatchPoint(i, x, self.prompts_per_batch) for i, x in enumerate(self.batch_throughputs))

    @property
    def never_accepted(self) -> bool:
        """Physics: a speculative run whose server counted drafts and accepted none of their tokens
        (0 accepted in every batch), or that proposed no draft at all; False for the baseline and
        when the counters are missing (unknown)."""
        if self.k == 0:
            return False
        if self.drafts is not None and self.drafts == 0:
            return True
        if self.draft_tokens is not None and self.draft_tokens == 0:
            return True
        return self.accepted_tokens is not None and self.accepted_tokens == 0 and bool(self.draft_tokens)

    @classmethod
    def from_cell(cls, cell: BenchCell, *, config: str, k: int, family: str = "", variable_width: bool = False,
                  workload: str | None = None, concurrency: int | None = None,
                  batches: tuple[BatchPoint, ...] = (), table: Any = None,
                  paired_baseline: tuple[BatchPoint, ...] = ()) -> Measurement:
        """Build from a load generator cell summary (:class:`specwatch.bench.records.BenchCell`);
        ``workload`` / ``concurrency``: the cell's when the summary does not say (a sweep cell names
        them itself); ``variable_width``: the server's speculative config had
        ``num_speculative_tokens_per_batch_size``; ``batches``: the measured batches with their
        pairing keys; ``table``: that table; ``paired_baseline``: a paired cell's baseline batches
        measured beside it. Raises KChoiceError if the cell has no output
        throughput, or no workload or concurrency."""
        wl = workload if workload is not None else cell.workload
        conc = concurrency if concurrency is not None else cell.max_concurrency
        thr = cell.output_throughput
        if thr is None or thr <= 0:
            raise KChoiceError(f"cell {config}/{wl}/c={conc} has no output throughput")
        if wl is None or conc is None:
            raise KChoiceError(f"cell {config}: the summary names no {'workload' if wl is None else 'concurrency'}")
        nb = cell.num_batches or 0
        failed = cell.failed or 0
        ppb = (cell.completed + failed) / nb if cell.completed is not None and nb > 0 else None
        gen = cell.generation_tokens if cell.generation_tokens is not None else cell.total_output_tokens
        counter_rates = tuple(float(x) for x in cell.per_position_acceptance_rates or ())
        rates, curve_basis = counter_rates, str(cell.curve_basis or "exact")
        pr = cell.per_request
        if pr is not None and pr.has_exact_curve:
            exact = pr.per_position_acceptance_rates or ()
            if exact and all(x is not None for x in exact):
                rates, curve_basis = tuple(float(x) for x in exact), "exact_per_request"
        return cls(
            config=config,
            k=int(k),
            workload=str(wl),
            concurrency=int(conc),
            output_throughput=float(thr),
            family=family,
            batch_throughputs=tuple(float(x) for x in cell.output_throughput_per_batch or () if x is not None),
            prompts_per_batch=None if ppb is None else float(ppb),
            mean_tpot_ms=_f(cell.mean_tpot_ms),
            mean_ttft_ms=_f(cell.mean_ttft_ms),
            acceptance_length=_f(cell.acceptance_length),
            acceptance_rate=cell.acceptance_rate,
            position_rates=rates,
            curve_basis=curve_basis,
            counter_position_rates=counter_rates,
            ragged_drafts=cell.curve_basis == "lower_bound",
            variable_width=bool(variable_width),
            drafts=_f(cell.num_drafts),
            draft_tokens=_f(cell.draft_tokens),
            accepted_tokens=_f(cell.accepted_tokens),
            generation_tokens=_f(gen),
            server_step_duration_ms=_f(cell.server_step_duration_ms),
            server_running_requests=_f(cell.server_running_requests),
            server_request_decode_tokens_per_second=_f(cell.server_request_decode_tokens_per_second),
            mean_itl_ms=_f(cell.mean_itl_ms),
            batches=tuple(batches),
            table=None if not table else tuple(tuple(int(x) for x in row) for row in table),
            paired_baseline=tuple(paired_baseline),
        )

    # -- derived -----------------------------------------------------------------------------
    @property
    def effective_concurrency(self) -> float:
        """Requests decoding side by side: the concurrency, capped by the prompts per batch."""
        c = float(self.concurrency)
        return min(c, self.prompts_per_batch) if self.prompts_per_batch else c

    @property
    def request_steps(self) -> float | None:
        """S = G − A: engine steps summed over requests (each emits 1 + accepted tokens)."""
        if self.generation_tokens is None:
            return None
        if self.k == 0:
            return self.generation_tokens
        if self.accepted_tokens is None:
            return None
        s = self.generation_tokens - self.accepted_tokens
        return s if s > 0 else None

    @property
    def tokens_per_step(self) -> float | None:
        """τ = G / S, output tokens per request-step (1 without speculation)."""
        if self.k == 0:
            return 1.0
        s = self.request_steps
        return None if s is None else self.generation_tokens / s

    @property
    def draft_fraction(self) -> float | None:
        """f = Δdrafts / S: share of request-steps that carried a draft."""
        s = self.request_steps
        if s is None or self.drafts is None:
            return None
        return self.drafts / s

    @property
    def verified_per_step(self) -> float | None:
        """x = Δdraft_tokens / S: draft tokens verified per request-step (0 for the baseline)."""
        if self.k == 0:
            return 0.0
        s = self.request_steps
        if s is None or self.draft_tokens is None:
            return None
        return self.draft_tokens / s

    @property
    def draft_tokens_per_draft(self) -> float | None:
        """d̄ = Δdraft_tokens / Δdrafts (≤ k; ngram may propose fewer)."""
        if not self.drafts or self.draft_tokens is None:
            return None
        return self.draft_tokens / self.drafts

    @property
    def step_time_s(self) -> float | None:
        """Throughput-equivalent step time T = c × τ / output_throughput (s)."""
        tau = self.tokens_per_step
        return None if tau is None else self.effective_concurrency * tau / self.output_throughput

    @property
    def step_time_tpot_s(self) -> float | None:
        """Decode step time from TPOT: T = mean TPOT × τ (s)."""
        tau = self.tokens_per_step
        if tau is None or self.mean_tpot_ms is None:
            return None
        return self.mean_tpot_ms / 1000.0 * tau

    @property
    def interval(self) -> tuple[float, float] | None:
        """The 95 % interval (tok/s) of the cell's throughput from its measured batches
        (:func:`specwatch.bench.results.throughput_interval`, Student's t); None with fewer than 2
        batches (a result file written before intervals were stored gets them from its batches)."""
        ci = throughput_interval(self.batch_throughputs)
        return None if ci.low is None else (ci.low, ci.high)

    @property
    def noise(self) -> float | None:
        """Relative standard error of the cell's mean throughput (stdev / mean / √n over its
        measured batches); None with fewer than 2 batches."""
        b = self.batch_throughputs
        if len(b) < 2:
            return None
        m = statistics.fmean(b)
        return statistics.stdev(b) / m / math.sqrt(len(b)) if m > 0 else None
