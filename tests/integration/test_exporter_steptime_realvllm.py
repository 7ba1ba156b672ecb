"""Issue #12 item 1 on the real vLLM: the exporter's live step duration against the load
generator's own inter-chunk times (ITL) for the same traffic.

vLLM observes ``vllm:inter_token_latency_seconds`` once per running request per engine step: the
time since that request's previous output. The load generator (``specwatch.bench.backend``)
measures, per streamed request, the time between consecutive content chunks; vLLM streams one
chunk per request per step. Both are means over the same gaps, so they agree up to delivery
jitter, which cancels in the mean, and one systematic effect: when the client falls behind (2
shared CPU cores running vLLM, the API server and the client), the API server merges the outputs
of two steps into one chunk, so the client sees fewer, longer gaps. Tolerance: 20 % relative.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import requests
from prometheus_client import CollectorRegistry

from exporter_helpers import series

pytestmark = pytest.mark.realvllm

N_REQUESTS = 8
CONCURRENCY = 2
MAX_TOKENS = 96


def _itl_count(url: str) -> float:
    text = requests.get(url, timeout=10).text
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith("vllm:inter_token_latency_seconds_count"))


async def _traffic(base_url: str, model: str):
    from specwatch.bench.backend import OpenAIBackend
    from specwatch.bench.workloads import BenchRequest
    from specwatch.localvllm.traffic import COPY_TEXTS, copy_prompt

    reqs = [BenchRequest(workload="copy", index=i, endpoint="completions",
                         prompt=copy_prompt(COPY_TEXTS[i % len(COPY_TEXTS)]), max_tokens=MAX_TOKENS,
                         temperature=0.0, ignore_eos=True) for i in range(N_REQUESTS)]
    sem = asyncio.Semaphore(CONCURRENCY)
    async with OpenAIBackend(base_url, model, timeout=600) as backend:
        async def one(r):
            async with sem:
                return await backend.send(r)
        return await asyncio.gather(*(one(r) for r in reqs))


def test_step_duration_matches_the_load_generators_inter_chunk_times(real_vllm):
    from specwatch.exporter.collector import SpecwatchCollector
    from specwatch.exporter.config import build_config

    cfg = build_config([f"spec={real_vllm.base_url}"], ("5m",), "127.0.0.1:1", min_fetch_interval=0.0)
    coll = SpecwatchCollector(cfg)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(coll)
    try:
        assert list(series(reg, "specwatch_up").values()) == [1.0]  # baseline fetch
        outcomes = asyncio.run(_traffic(real_vllm.base_url, real_vllm.served_model_name))
        assert all(o.success for o in outcomes), [o.error for o in outcomes if not o.success]
        # wait until vLLM's histograms have taken the last outputs
        prev, t0 = -1.0, time.monotonic()
        while time.monotonic() - t0 < 10:
            cur = _itl_count(real_vllm.metrics_url)
            if cur == prev:
                break
            prev = cur
            time.sleep(0.5)
        samples = list(s for f in reg.collect() for s in f.samples)
        wv = next(w for w in coll.window_values() if w.window == "5m")
    finally:
        coll.close()

    gaps = [g for o in outcomes for g in o.itl]
    client_itl = sum(gaps) / len(gaps)
    step = wv.step.step_duration_seconds
    exposed = list(series(samples, "specwatch_step_duration_seconds", window="5m").values())
    assert exposed == [pytest.approx(step)]
    client_decode = sum(o.output_tokens - 1 for o in outcomes) / sum(gaps)
    print(f"\nstep duration: exporter {step * 1e3:.1f} ms (vLLM ITL histogram) vs load generator "
          f"{client_itl * 1e3:.1f} ms mean inter-chunk time over {len(gaps)} gaps (ratio {step / client_itl:.3f}); "
          f"decode speed per request: exporter {wv.step.request_decode_tokens_per_second:.1f} vs client "
          f"{client_decode:.1f} tok/s; engine steps/s {wv.step.engine_steps_per_second:.2f}, "
          f"running requests (mean over fetches) {wv.step.running_requests:.2f}")
    assert step == pytest.approx(client_itl, rel=0.20)
    assert wv.step.request_decode_tokens_per_second == pytest.approx(client_decode, rel=0.20)
    assert wv.step.engine_steps_per_second > 0
