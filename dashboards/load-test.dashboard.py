"""specwatch / Load test: baseline vs speculative output throughput, TTFT and TPOT against
concurrency, from the load generator's own metrics (``specwatch bench --metrics-port``; labels
role = baseline | speculative, workload, concurrency).

A cell is one (role, workload, concurrency) run. The "by concurrency" bar gauges show, per cell,
the last value seen in the time range: the gauges the load generator sets after each finished
batch, and for latency histograms the windowed value while the cell was running (cells that are
not running drop out of the rate, so their last value is the one from their run).
"""

from specwatch.mixin.config import MixinConfig

from .lib import (
    SPEEDUP, WORKLOAD, Section, Sel, bargauge, dashboard, q, timeseries, variables,
)


def build(cfg: MixinConfig):
    """The Load test dashboard for ``cfg``, a grafanalib Dashboard.

    Selectors, windows and thresholds come from ``cfg``: the same MixinConfig the recording rules
    and alerts are generated from (``python -m specwatch.mixin.generate --config``)."""
    S = Sel(cfg)

    B = S.bench(WORKLOAD)
    CELL = "role, workload, concurrency"
    CELL_LEGEND = "concurrency {{concurrency}} · {{role}} · {{workload}}"
    THROUGHPUT = f"specwatch_bench_output_throughput_tokens_per_second{B}"

    def _spec(role: str) -> str:
        return f'specwatch_bench_output_throughput_tokens_per_second{S.bench(WORKLOAD, f"role={chr(34)}{role}{chr(34)}")}'

    def _running(hist: str) -> str:
        """Cells with finished requests in the current window (filters the NaN of idle cells)."""
        return f"sum by ({CELL}) (rate({hist}_count{B}[$__rate_interval])) > 0"

    def _quantile(hist: str, quantile: float) -> str:
        return (f"histogram_quantile({quantile}, sum by (le, {CELL}) (rate({hist}_bucket{B}[$__rate_interval]))) "
                f"and {_running(hist)}")

    def _mean(hist: str) -> str:
        return (f"sum by ({CELL}) (rate({hist}_sum{B}[$__rate_interval])) / {_running(hist)}")

    TTFT = "specwatch_bench_ttft_seconds"
    TPOT = "specwatch_bench_tpot_seconds"
    ITL = "specwatch_bench_itl_seconds"
    E2E = "specwatch_bench_e2e_latency_seconds"

    by_concurrency = Section("Baseline vs speculative, by concurrency", [
        bargauge("Output throughput by concurrency",
                 "specwatch_bench_output_throughput_tokens_per_second: output tokens per second of the last finished "
                 "batch of each cell, baseline and speculative server side by side per concurrency.",
                 "cps", [q(THROUGHPUT, CELL_LEGEND)], minimum=0, h=10),
        bargauge("Measured speedup by concurrency",
                 "Speculative / baseline output throughput of the same workload and concurrency (last finished "
                 "batches). Above 1, speculation pays at that concurrency. Empty until both roles have run.",
                 "none", [q(f"max by (workload, concurrency) ({_spec('speculative')}) / "
                            f"max by (workload, concurrency) ({_spec('baseline')})",
                            "concurrency {{concurrency}} · {{workload}}")],
                 thresholds=SPEEDUP, decimals=2, minimum=0, h=10),
        bargauge("TTFT p95 by concurrency",
                 "Time to first token, p95 over $__rate_interval while each cell ran (specwatch_bench_ttft_seconds, "
                 "measured by the load generator).",
                 "s", [q(_quantile(TTFT, 0.95), CELL_LEGEND)], minimum=0, h=10),
        bargauge("TPOT p95 by concurrency",
                 "Time per output token after the first, per request, p95 over $__rate_interval while each cell ran "
                 "(specwatch_bench_tpot_seconds).",
                 "s", [q(_quantile(TPOT, 0.95), CELL_LEGEND)], minimum=0, h=10),
    ])

    over_time = Section("Over time", [
        timeseries("Output throughput by role",
                   "Output tokens per second received by the load generator (rate of "
                   "specwatch_bench_output_tokens_total over $__rate_interval), per cell.",
                   "cps", [q(f"sum by ({CELL}) (rate(specwatch_bench_output_tokens_total{B}[$__rate_interval]))",
                             CELL_LEGEND)], minimum=0),
        timeseries("Requests per second by outcome",
                   "Finished requests per second, success or error (specwatch_bench_requests_total).",
                   "reqps", [q(f"sum by (role, outcome) (rate(specwatch_bench_requests_total{B}[$__rate_interval]))",
                               "{{role}} · {{outcome}}")], minimum=0),
        timeseries("TTFT (p50, p95, mean)",
                   "Time to first token measured by the load generator, per cell, over $__rate_interval.",
                   "s", [q(_quantile(TTFT, 0.5), "p50 · " + CELL_LEGEND),
                         q(_quantile(TTFT, 0.95), "p95 · " + CELL_LEGEND),
                         q(_mean(TTFT), "mean · " + CELL_LEGEND)], minimum=0),
        timeseries("TPOT and ITL",
                   "Per-request time per output token (TPOT) beside the gap between streamed chunks (ITL), per cell, "
                   "over $__rate_interval. With speculation several tokens arrive per chunk, so ITL grows while "
                   "TPOT falls.",
                   "s", [q(_mean(TPOT), "TPOT mean · " + CELL_LEGEND),
                         q(_quantile(TPOT, 0.95), "TPOT p95 · " + CELL_LEGEND),
                         q(_mean(ITL), "ITL mean · " + CELL_LEGEND)], minimum=0),
        timeseries("End-to-end latency (p50, p95)",
                   "Request latency from send to last token (specwatch_bench_e2e_latency_seconds), per cell.",
                   "s", [q(_quantile(E2E, 0.5), "p50 · " + CELL_LEGEND),
                         q(_quantile(E2E, 0.95), "p95 · " + CELL_LEGEND)], minimum=0),
        timeseries("In-flight requests and running cell",
                   "Requests in flight from the load generator (specwatch_bench_in_flight_requests) and the running "
                   "cell (specwatch_bench_active == 1, value 1).",
                   "none", [q(f"sum by (role) (specwatch_bench_in_flight_requests{S.bench()})", "in flight · {{role}}"),
                            q(f"max by ({CELL}) (specwatch_bench_active{B} == 1)", "running · " + CELL_LEGEND)],
                   minimum=0),
        timeseries("Draft acceptance rate per cell (last batch)",
                   "specwatch_bench_spec_decode_acceptance_rate: the speculative server's draft acceptance rate over "
                   "the last finished batch of each cell, from its /metrics before and after the batch.",
                   "percentunit", [q(f"specwatch_bench_spec_decode_acceptance_rate{B}", CELL_LEGEND)],
                   minimum=0, maximum=1),
        timeseries("Server-side output throughput (vLLM)",
                   "Output tokens per second as vLLM counts them (rate of vllm:generation_tokens_total), to cross-check "
                   "the load generator's own count.",
                   "cps", [q(f"sum by (instance, model_name) (rate(vllm:generation_tokens_total{S.vllm()}[$__rate_interval]))",
                             "{{instance}} · {{model_name}}")], minimum=0),
    ])

    return dashboard(
        uid="specwatch-load-test",
        title="specwatch / Load test",
        description="Baseline vs speculative output throughput, TTFT and TPOT against concurrency, from specwatch "
                    "bench's metrics. Generated by dashboards/generate.py; do not edit.",
        sections=[by_concurrency, over_time],
        templates=variables(cfg, workload=True),
        tags=("specwatch", "vllm", "load-test"),
    )
