#!/usr/bin/env python3
"""Write the CONSTRUCTED SGLang /metrics fixtures (tests/fixtures/metrics/sglang-0.5.23-*-constructed.txt).

No SGLang server runs here (no GPU), so these bodies are built with prometheus_client from the
metric definitions of SGLang 0.5.23 (python/sglang/srt/observability/metrics_collector.py in the
sglang-0.5.23 wheel): the same names, HELP texts, types and label names. Scheduler-side gauges carry
model_name, engine_type, tp_rank, pp_rank, moe_ep_rank and (with data parallelism) dp_rank; only
attention-TP rank 0 of each DP rank logs them, so a TP=2, DP=2 server prints two gauge series per
family (tp_rank 0, dp_rank 0 and 1). Tokenizer-side counters carry model_name and engine_type (plus
is_streaming on generation_tokens_total and num_requests_total) and no rank labels. SGLang runs
prometheus_client in multiprocess mode, which prints no `_created` samples; neither do these.

Scenarios (values chosen so the expected results are easy to compute by hand; see tests/unit/test_sglang.py):
  fresh         server up, speculation on (EAGLE, 3 steps, 4 draft tokens), no request finished yet
  after-traffic 12 finished requests: gen 1500 (1200 + 300 streaming), verify 496
  later         +8 requests: gen 2300 (1800 + 500), finished 20, verify 896
  after-restart the server restarted: gen 400, finished 4, verify 132
  nospec        speculation off: gauges at 0, no verify counter
  nan-gauge     after-traffic with spec_accept_rate NaN on dp_rank 1
"""
from __future__ import annotations

import sys
from pathlib import Path

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

prometheus_client.disable_created_metrics()
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "metrics"
MODEL = "Qwen/Qwen3-32B"
SCHED = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank"]
TOK = ["model_name", "engine_type"]
HEADER = ("# CONSTRUCTED fixture (not captured): built by scripts/construct_sglang_fixtures.py from the metric\n"
          "# definitions of SGLang 0.5.23 (python/sglang/srt/observability/metrics_collector.py). Scenario: {}\n")


def body(scenario: str, gauges: dict[int, dict[str, float]], counters: dict | None) -> str:
    reg = CollectorRegistry()
    g = {n: Gauge(f"sglang:{n}", doc, labelnames=SCHED, registry=reg) for n, doc in (
        ("num_running_reqs", "The number of running requests."),
        ("gen_throughput", "The generation throughput (token/s)."),
        ("spec_accept_length", "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward)."),
        ("spec_accept_rate", "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch)."),
        ("spec_cap_length",
         "Mean DSpark confidence-scheduled verify window per verify step, incl the bonus slot (0 when no cap is scheduled)."),
        ("spec_block_accept_length",
         "Mean uncapped full-block accept length per verify step (accept + cap-trimmed drafts; exact only in DSpark cap-accept mode)."),
        ("spec_num_steps", "Currently active speculative_num_steps."),
        ("spec_num_draft_tokens", "Currently active speculative_num_draft_tokens (decouples from steps under topk>1)."),
        ("fwd_occupancy", "Forward pass GPU occupancy percentage."),
    )}
    for dp, values in gauges.items():
        labels = dict(model_name=MODEL, engine_type="unified", tp_rank="0", pp_rank="0", moe_ep_rank="0", dp_rank=str(dp))
        for n, v in values.items():
            g[n].labels(**labels).set(v)
    gen = Counter("sglang:generation_tokens_total", "Number of generation tokens processed.", labelnames=TOK + ["is_streaming"],
                  registry=reg)
    fin = Counter("sglang:num_requests_total", "Number of requests processed.", labelnames=TOK + ["is_streaming"], registry=reg)
    ver = Counter("sglang:spec_verify_calls_total", "Number of speculative decoding verification calls.", labelnames=TOK, registry=reg)
    Counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", labelnames=TOK + ["is_streaming"], registry=reg)
    if counters:
        for streaming, (gv, fv) in counters["by_stream"].items():
            gen.labels(MODEL, "unified", streaming).inc(gv)
            fin.labels(MODEL, "unified", streaming).inc(fv)
        if counters.get("verify") is not None:
            ver.labels(MODEL, "unified").inc(counters["verify"])
    return HEADER.format(scenario) + generate_latest(reg).decode()


def spec_gauges(rate0: float, rate1: float, length0: float = 2.9, length1: float = 3.1) -> dict:
    common = dict(spec_cap_length=0.0, spec_block_accept_length=0.0, spec_num_steps=3, spec_num_draft_tokens=4,
                  fwd_occupancy=float("nan"), gen_throughput=812.5)
    return {0: {**common, "spec_accept_rate": rate0, "spec_accept_length": length0, "num_running_reqs": 5},
            1: {**common, "spec_accept_rate": rate1, "spec_accept_length": length1, "num_running_reqs": 3}}


SCENARIOS = {
    "fresh": (spec_gauges(0.0, 0.0, 0.0, 0.0), None),
    "after-traffic": (spec_gauges(0.61, 0.69), {"by_stream": {"false": (1200, 10), "true": (300, 2)}, "verify": 496}),
    "later": (spec_gauges(0.66, 0.70), {"by_stream": {"false": (1800, 16), "true": (500, 4)}, "verify": 896}),
    "after-restart": (spec_gauges(0.55, 0.60), {"by_stream": {"false": (400, 4)}, "verify": 132}),
    "nospec": ({0: {"spec_accept_rate": 0, "spec_accept_length": 0, "spec_num_steps": 0, "spec_num_draft_tokens": 0,
                    "num_running_reqs": 2}}, {"by_stream": {"false": (640, 5)}}),
    "nan-gauge": (spec_gauges(0.61, float("nan")), {"by_stream": {"false": (1200, 10), "true": (300, 2)}, "verify": 496}),
}


def main() -> int:
    for name, (gauges, counters) in SCENARIOS.items():
        path = OUT / f"sglang-0.5.23-eagle-tp2-dp2-{name}-constructed.txt"
        if name == "nospec":
            path = OUT / "sglang-0.5.23-nospec-constructed.txt"
        path.write_text(body(name, gauges, counters))
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
