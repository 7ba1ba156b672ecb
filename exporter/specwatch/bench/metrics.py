"""The load generator's own Prometheus metrics (``specwatch_bench_*``, listed in docs/load-generator.md), so
dashboards can show the load beside the server's acceptance.

Labels: ``role`` ("baseline" | "speculative"), ``workload``, ``concurrency``. The metrics live in
their own :class:`prometheus_client.CollectorRegistry` (never the global one) and are served by
:meth:`BenchMetrics.serve` on ``--metrics-port`` (default 19338) while a run lasts.

- ``specwatch_bench_requests_total{outcome="success"|"error"}``, ``…_output_tokens_total``,
  ``…_prompt_tokens_total`` (counters; tokens from the streamed ``usage``)
- ``specwatch_bench_ttft_seconds``, ``…_tpot_seconds``, ``…_itl_seconds``,
  ``…_e2e_latency_seconds`` (histograms, client-side, seconds; ITL is observed when each batch
  ends, the others as each request ends)
- ``specwatch_bench_active`` (1 for the cell being run, 0 for cells already run),
  ``specwatch_bench_in_flight_requests{role}``,
  ``specwatch_bench_output_throughput_tokens_per_second`` and
  ``specwatch_bench_spec_decode_acceptance_rate`` (0–1; last finished batch of the cell, from the
  server's /metrics counter deltas Δaccepted / Δdraft_tokens).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from specwatch.bench.backend import RequestOutcome

LABELS = ("role", "workload", "concurrency")

#: Latency buckets (seconds): 1 ms … 10 min; TTFT on a CPU box reaches seconds.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)


class _Cell:
    """Label-bound children of one (role, workload, concurrency): no label lookup per request."""

    __slots__ = ("ok", "err", "out_tok", "prompt_tok", "ttft", "tpot", "itl", "e2e", "in_flight")

    def __init__(self, m: "BenchMetrics", role: str, workload: str, concurrency: str) -> None:
        lv = (role, workload, concurrency)
        self.ok = m.requests.labels(*lv, "success")
        self.err = m.requests.labels(*lv, "error")
        self.out_tok = m.output_tokens.labels(*lv)
        self.prompt_tok = m.prompt_tokens.labels(*lv)
        self.ttft = m.ttft.labels(*lv)
        self.tpot = m.tpot.labels(*lv)
        self.itl = m.itl.labels(*lv)
        self.e2e = m.e2e.labels(*lv)
        self.in_flight = m.in_flight.labels(role)


class BenchMetrics:
    """The ``specwatch_bench_*`` families in a private registry (``self.registry``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "specwatch_bench_requests", "Requests sent by specwatch bench, by outcome.",
            LABELS + ("outcome",), registry=r)
        self.output_tokens = Counter(
            "specwatch_bench_output_tokens", "Output tokens received (usage.completion_tokens, else content chunks).",
            LABELS, registry=r)
        self.prompt_tokens = Counter(
            "specwatch_bench_prompt_tokens", "Prompt tokens sent (usage.prompt_tokens as reported by the server).",
            LABELS, registry=r)
        self.ttft = Histogram(
            "specwatch_bench_ttft_seconds", "Client-side time to first content chunk.",
            LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(
            "specwatch_bench_tpot_seconds", "Client-side time per output token: (e2e - ttft) / (output_tokens - 1).",
            LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(
            "specwatch_bench_itl_seconds", "Client-side gap between consecutive content chunks.",
            LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(
            "specwatch_bench_e2e_latency_seconds", "Client-side request latency, send to end of stream.",
            LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self.active = Gauge(
            "specwatch_bench_active", "1 for the (role, workload, concurrency) being run now, 0 for cells already run.",
            LABELS, registry=r)
        self.in_flight = Gauge(
            "specwatch_bench_in_flight_requests", "Requests sent and not yet finished.", ("role",), registry=r)
        self.throughput = Gauge(
            "specwatch_bench_output_throughput_tokens_per_second",
            "Output tokens / batch duration of the last finished batch of the cell.", LABELS, registry=r)
        self.acceptance = Gauge(
            "specwatch_bench_spec_decode_acceptance_rate",
            "Draft acceptance rate (0-1) over the last finished batch of the cell: delta of "
            "vllm:spec_decode_num_accepted_tokens_total / delta of vllm:spec_decode_num_draft_tokens_total.",
            LABELS, registry=r)
        self._cells: dict[tuple[str, str, str], _Cell] = {}
        self._active: tuple[str, str, str] | None = None
        self._server: Any = None

    def cell(self, role: str, workload: str, concurrency: int) -> _Cell:
        """Bound children for one cell (created on first use)."""
        key = (role, workload, str(concurrency))
        c = self._cells.get(key)
        if c is None:
            c = self._cells[key] = _Cell(self, *key)
        return c

    def set_active(self, role: str, workload: str, concurrency: int) -> None:
        """Mark this cell as the one being run (the previous one drops to 0)."""
        key = (role, workload, str(concurrency))
        if self._active is not None and self._active != key:
            self.active.labels(*self._active).set(0)
        self.active.labels(*key).set(1)
        self._active = key

    def clear_active(self) -> None:
        """No cell is running any more (end of run)."""
        if self._active is not None:
            self.active.labels(*self._active).set(0)
            self._active = None

    @staticmethod
    def request_started(cell: _Cell) -> None:
        cell.in_flight.inc()

    @staticmethod
    def request_finished(cell: _Cell, o: RequestOutcome) -> None:
        """Count one finished request and observe its latencies (successful ones only)."""
        cell.in_flight.dec()
        if not o.success:
            cell.err.inc()
            return
        cell.ok.inc()
        cell.out_tok.inc(o.output_tokens)
        if o.prompt_tokens:
            cell.prompt_tok.inc(o.prompt_tokens)
        if o.ttft is not None:
            cell.ttft.observe(o.ttft)
        tpot = o.tpot
        if tpot is not None:
            cell.tpot.observe(tpot)
        cell.e2e.observe(o.latency)

    @staticmethod
    def observe_itls(cell: _Cell, gaps: "list[float]") -> None:
        """Observe a finished batch's inter-token gaps (seconds). Done once per batch, after its
        clock stopped: one observation per token is the costliest metric work of the client."""
        observe = cell.itl.observe
        for gap in gaps:
            observe(gap)

    def batch_finished(self, role: str, workload: str, concurrency: int,
                       output_throughput: float, acceptance_rate: float | None) -> None:
        """Publish the last finished batch's throughput (tok/s) and acceptance (0–1, if known)."""
        lv = (role, workload, str(concurrency))
        self.throughput.labels(*lv).set(output_throughput)
        if acceptance_rate is not None:
            self.acceptance.labels(*lv).set(acceptance_rate)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve the registry over HTTP on ``port`` (a daemon thread). Raises OSError if taken."""
        self._server = start_http_server(port, addr=addr, registry=self.registry)

    def shutdown(self) -> None:
        """Stop the HTTP server started by :meth:`serve` (no-op if none)."""
        if self._server is not None:
            server, thread = self._server
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
            self._server = None
