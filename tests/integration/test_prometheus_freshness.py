"""``composestack.wait_for_fresh_scrape_and_eval`` (what the compose end-to-end test waits with
instead of fixed sleeps) against a real Prometheus: Debian's binary scraping a stub target that is
up and a port where nothing listens, every second, with one recording-rule group evaluated every
second. The helper returns once every named target was scraped after ``since`` and every named
group evaluated after those scrapes; it raises, naming what was stale, when that cannot happen in
time, when a job or group does not exist, or when a target that must be up is down."""

from __future__ import annotations

import time

import pytest
import yaml

import composestack as cs
import realstack
from httpstub import QuietHandler, base_url, send, serve_in_thread

pytestmark = pytest.mark.prometheus

GROUP = "freshness-test"


class MetricsHandler(QuietHandler):
    def do_GET(self):  # http.server API
        send(self, b"# TYPE freshness_stub_value gauge\nfreshness_stub_value 1\n", "text/plain; version=0.0.4")


@pytest.fixture(scope="module")
def prom(prometheus_server, tmp_path_factory):
    """(Prometheus URL, the stub's instance, the dead instance): jobs ``stub`` (up) and ``gone``
    (connection refused), scrape and evaluation every 1 s, rule group GROUP."""
    work = tmp_path_factory.mktemp("freshness")
    (work / "rules.yml").write_text(yaml.safe_dump({"groups": [
        {"name": GROUP, "interval": "1s", "rules": [{"record": "job:up:sum", "expr": "sum by (job) (up)"}]}]}))
    with serve_in_thread(MetricsHandler) as srv:
        stub = base_url(srv).split("://", 1)[1]
        gone = f"127.0.0.1:{realstack.free_port()}"
        realstack.write_prometheus_config(work / "prometheus.yml", {"stub": [(stub, {})], "gone": [(gone, {})]},
                                          interval="1s", rule_files=["rules.yml"])
        url = prometheus_server(work / "prometheus.yml")
        # both targets scraped once and the group evaluated once: Prometheus is running its loops
        realstack.wait_for("a first scrape and evaluation", lambda: realstack.prometheus_has_samples(
            url, 'count(job:up:sum)', 2), 60)
        yield url, stub, gone


def test_returns_once_every_target_was_scraped_and_every_group_evaluated_after_since(prom):
    url, stub, gone = prom
    since = time.time()
    seen = cs.wait_for_fresh_scrape_and_eval(url, since, jobs=["stub", "gone"], groups=[GROUP], up=[stub], timeout=30)
    took = time.time() - since
    assert took < 15, f"took {took:.1f} s with 1 s intervals"
    targets = seen["targets"]
    assert set(targets) == {f"stub/{stub}", f"gone/{gone}"}
    assert all(t["last_scrape"] > since for t in targets.values()), targets
    # a failed scrape is a scrape: the dead target is fresh (only `up` asks for health)
    assert targets[f"stub/{stub}"]["health"] == "up" and targets[f"gone/{gone}"]["health"] == "down"
    # the group was evaluated after fresh scrapes of both had ended, so the evaluation saw them
    assert seen["groups"][GROUP] > seen["rules_after"] > since
    assert seen["rules_after"] <= max(t["scrape_end"] for t in targets.values())  # the end of a real scrape
    # the helper read the API's clock right: nothing it saw is in the future
    assert max([*(t["last_scrape"] for t in targets.values()), seen["groups"][GROUP]]) <= time.time()


def test_without_jobs_a_group_evaluated_after_since_is_enough(prom):
    url, _, _ = prom
    since = time.time()
    seen = cs.wait_for_fresh_scrape_and_eval(url, since, groups=[GROUP], timeout=30)
    assert seen["targets"] == {} and seen["rules_after"] == since and seen["groups"][GROUP] > since


def test_an_impossible_wait_raises_naming_every_stale_target_and_group(prom):
    url, stub, gone = prom
    since = time.time() + 3600  # no scrape or evaluation can be later than this within the timeout
    t0 = time.monotonic()
    with pytest.raises(AssertionError) as info:
        cs.wait_for_fresh_scrape_and_eval(url, since, jobs=["stub", "gone"], groups=[GROUP], timeout=1.5)
    assert time.monotonic() - t0 < 10
    msg = str(info.value)
    assert url in msg and "within 1.5 s" in msg
    assert f"target stub/{stub}: last scraped" in msg and f"target gone/{gone}: last scraped" in msg
    assert f"rule group '{GROUP}': last evaluated" in msg


def test_a_zero_timeout_looks_once(prom):
    url, stub, _ = prom
    with pytest.raises(AssertionError, match=f"target stub/{stub}: last scraped"):
        cs.wait_for_fresh_scrape_and_eval(url, time.time() + 60, jobs=["stub"], timeout=0)


def test_a_missing_job_or_group_and_a_target_that_is_down_are_named(prom):
    url, stub, gone = prom
    with pytest.raises(AssertionError) as info:
        cs.wait_for_fresh_scrape_and_eval(url, time.time(), jobs=["stub", "gone", "nosuch"], groups=[GROUP, "nosuch-group"],
                                          up=[stub, gone, "nowhere:1"], timeout=5)
    msg = str(info.value)
    assert "job 'nosuch': no active target" in msg
    assert "rule group 'nosuch-group': not loaded" in msg
    assert f"target gone/{gone}: health down" in msg and "connection refused" in msg
    assert "target nowhere:1: no active target" in msg
    # what was fresh within the 5 s is not named
    assert f"target stub/{stub}" not in msg and f"target gone/{gone}: last scraped" not in msg


def test_rfc3339_seconds_reads_prometheus_timestamps():
    assert cs.rfc3339_seconds("1970-01-01T00:00:01.5Z") == 1.5
    assert cs.rfc3339_seconds("2026-12-02T14:14:00.123456789Z") == pytest.approx(1796220840.123456789, abs=1e-6)
    assert cs.rfc3339_seconds("2026-12-02T15:14:00+01:00") == cs.rfc3339_seconds("2026-12-02T14:14:00Z")
    assert cs.rfc3339_seconds("0001-01-01T00:00:00Z") < 0  # never scraped
    with pytest.raises(ValueError):
        cs.rfc3339_seconds("yesterday")
