"""Issue #14 over real sockets: header-trickling upstreams, and `specwatch serve`'s own port under
floods (backlog, slowloris, huge headers, 1,000 held connections, request limit), IPv6, bad flags.
Every server here listens on 127.0.0.1 / ::1 only."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter_helpers import fixture, wait_serve_started
from httpstub import base_url, serve_in_thread
from polling import wait_until
from specwatch.common.processes import stop_process_group

BODY = fixture("vllm-0.32-ngram-k4-after-traffic.txt").encode()
_MIB = 1024 * 1024
#: Bodies whose one kept line makes prometheus_client's label parser quadratic (issue #14, G1):
#: 2 MiB of short labels on a vllm:num_requests_running line (13.5 s to parse on its own), and
#: 1 MiB of escaped quotes in one label value (each quote re-slices the value).
MANY_LABELS = BODY + b"vllm:num_requests_running{" + b",".join(
    b'l%d="v"' % i for i in range((2 * _MIB - len(BODY)) // 12)) + b"} 1.0\n"
ESCAPED = BODY + b'vllm:num_requests_running{engine="0",model_name="' + b'\\"' * ((_MIB - len(BODY)) // 2) + b'"} 1.0\n'
#: A body the parse_body stand-in in test_a_slow_parse_* holds for a while (a marker comment).
SLOW_PARSE = BODY + b"# specwatch-test: slow parse\n"


class _State:
    healed = threading.Event()


class _Upstream(BaseHTTPRequestHandler):
    """/good, /slow (3 s), /late (0.3 s, then /good), /trickle (header bytes every 0.2 s,
    forever, until healed), /cut (close-delimited body cut inside a number), /manylabels,
    /escaped, /slowparse (the bodies above)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        mode = self.path.strip("/").split("/")[0]
        try:
            if mode == "trickle" and not _State.healed.is_set():
                self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Trickle: ")
                while not _State.healed.is_set():
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.2)
                return
            if mode == "slow":
                time.sleep(3)
            if mode == "late":
                time.sleep(0.3)
            if mode == "cut":
                body = BODY[: BODY.index(b"accepted_tokens_total{") + len(b'accepted_tokens_total{engine="0",model_name="smollm2"} 15')]
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n" + body)
                self.wfile.flush()
                self.close_connection = True
                return
            body = {"manylabels": MANY_LABELS, "escaped": ESCAPED, "slowparse": SLOW_PARSE}.get(mode, BODY)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass


@pytest.fixture(scope="module")
def upstream_url():
    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 128

    with serve_in_thread(_Upstream, Server) as srv:
        yield base_url(srv)
        _State.healed.set()


def _free_port(family=socket.AF_INET, host="127.0.0.1") -> int:
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _up(text: str) -> dict[str, float]:
    return {s.labels["upstream"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "specwatch_up"}


# ---- 2. a header-trickling upstream beside healthy ones --------------------------------------

def test_header_trickling_upstream_never_stalls_the_exporter(upstream_url):
    from specwatch.exporter.collector import SpecwatchCollector
    from specwatch.exporter.config import build_config

    _State.healed.clear()
    names = ["trickle"] + [f"good{i}" for i in range(3)]
    urls = [f"trickle={upstream_url}/trickle"] + [f"good{i}={upstream_url}/good" for i in range(3)]
    # A 2-s deadline: with 1 s a healthy in-process upstream missed it when the machine was busy
    # (two CPU-heavy processes beside the suite). The stall this guards against pinned one fetch
    # worker per scrape (4 workers here); 20 scrapes as the issue asks.
    timeout = 2.0
    try:
        cfg = build_config(urls, (), "127.0.0.1:1", timeout_seconds=timeout, min_fetch_interval=0.0)
    except TypeError:  # the code before the fix had no min_fetch_interval (and no coalescing)
        cfg = build_config(urls, (), "127.0.0.1:1", timeout_seconds=timeout)
    reg = CollectorRegistry(auto_describe=False)
    coll = SpecwatchCollector(cfg)
    reg.register(coll)
    try:
        for i in range(20):
            t0 = time.monotonic()
            up = _up(generate_latest(reg).decode())
            took = time.monotonic() - t0
            assert took < timeout + 1.5, (i, took)
            assert up == {"trickle": 0.0, **{n: 1.0 for n in names[1:]}}, (i, up)
        _State.healed.set()  # the upstream recovers
        wait_until(lambda: _up(generate_latest(reg).decode()) == {n: 1.0 for n in names}, 10)  # its held fetch ends
        ups = [_up(generate_latest(reg).decode()) for _ in range(2)]
        assert ups[-1] == {n: 1.0 for n in names}, ups
    finally:
        _State.healed.set()
        getattr(coll, "close", lambda: None)()


def _collector_for(urls, timeout):
    from specwatch.exporter.collector import SpecwatchCollector
    from specwatch.exporter.config import build_config

    cfg = build_config(urls, (), "127.0.0.1:1", timeout_seconds=timeout, min_fetch_interval=0.0)
    reg = CollectorRegistry(auto_describe=False)
    coll = SpecwatchCollector(cfg)
    reg.register(coll)
    return reg, coll


def _errors(text: str, upstream: str) -> dict[str, float]:
    return {s.labels["reason"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "specwatch_upstream_fetch_errors_total" and s.labels["upstream"] == upstream}


def test_bodies_that_would_stall_the_parser_fail_alone_over_http(upstream_url):
    """Issue #14, G1: a 2 MiB many-label body and a 1 MiB escaped-label body beside two healthy
    upstreams, over several scrapes. Before, their parse ran for seconds on the fetch loop, so
    the healthy upstreams read up 0 (previous fetch still running) scrape after scrape. Now the
    pre-filter refuses them (reason parse) and every scrape ends within the deadline."""
    timeout = 2.0  # chosen for a loaded machine, as in the trickle test
    reg, coll = _collector_for([f"manylabels={upstream_url}/manylabels", f"escaped={upstream_url}/escaped",
                                f"good0={upstream_url}/good", f"good1={upstream_url}/late"], timeout)
    try:
        for i in range(6):
            t0 = time.monotonic()
            text = generate_latest(reg).decode()
            took = time.monotonic() - t0
            assert took < timeout + 1.5, (i, took)
            assert _up(text) == {"manylabels": 0.0, "escaped": 0.0, "good0": 1.0, "good1": 1.0}, (i, _up(text))
            for bad in ("manylabels", "escaped"):
                assert _errors(text, bad) == {"parse": float(i + 1)}, (i, bad, _errors(text, bad))
    finally:
        coll.close()


def test_a_slow_parse_runs_off_the_fetch_loop_under_the_deadline(upstream_url, monkeypatch):
    """Issue #14, G1 (b): a parse that holds the GIL in Python for 4 s (a stand-in for a slow
    parser) must not stop the other fetches, and the deadline covers it: that upstream reads
    up 0 (timeout) and is not fetched again while its parse still runs; the healthy ones (their
    answers come 0.3 s later, so on the old code they waited behind the parse) stay up."""
    from specwatch.exporter import fetching

    real = fetching.parse_body

    def parse_body(text, *args, **kw):
        if text.endswith("# specwatch-test: slow parse\n"):
            end = time.monotonic() + 4.0
            while time.monotonic() < end:  # pure Python: holds the GIL between switch intervals
                pass
        return real(text, *args, **kw)

    monkeypatch.setattr(fetching, "parse_body", parse_body)
    timeout = 2.0
    reg, coll = _collector_for([f"slowparse={upstream_url}/slowparse", f"good0={upstream_url}/late",
                                f"good1={upstream_url}/late"], timeout)
    try:
        for i in range(3):
            t0 = time.monotonic()
            text = generate_latest(reg).decode()
            took = time.monotonic() - t0
            assert took < timeout + 1.5, (i, took)
            assert _up(text) == {"slowparse": 0.0, "good0": 1.0, "good1": 1.0}, (i, _up(text))
        assert set(_errors(text, "slowparse")) == {"timeout"}
        fetches = {s.labels["upstream"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == "specwatch_upstream_fetches_total"}
        assert fetches["good0"] == 3.0 and fetches["slowparse"] < 3.0, fetches
    finally:
        coll.close()


def test_close_delimited_body_cut_mid_number_is_truncated(upstream_url):
    from specwatch.exporter.collector import SpecwatchCollector
    from specwatch.exporter.config import build_config

    cfg = build_config([f"cut={upstream_url}/cut", f"good={upstream_url}/good"], (), "127.0.0.1:1")
    reg = CollectorRegistry(auto_describe=False)
    coll = SpecwatchCollector(cfg)
    reg.register(coll)
    text = generate_latest(reg).decode()
    getattr(coll, "close", lambda: None)()
    assert _up(text) == {"cut": 0.0, "good": 1.0}
    assert 'specwatch_upstream_fetch_errors_total{reason="truncated",upstream="cut"} 1.0' in text


# ---- 6. the exporter's own port ----------------------------------------------------------------

def _start_serve(upstream_url, *args, listen="127.0.0.1", nofile: int | None = None):
    family = socket.AF_INET6 if ":" in listen else socket.AF_INET
    port = _free_port(family, listen)
    addr = f"[{listen}]:{port}" if family == socket.AF_INET6 else f"{listen}:{port}"

    def limit():
        if nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    proc = subprocess.Popen([sys.executable, "-m", "specwatch", "serve", "--listen-address", addr,
                             "--upstream", f"good={upstream_url}/good", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=limit)
    base = f"http://{'[' + listen + ']' if family == socket.AF_INET6 else listen}:{port}"
    wait_serve_started(proc, base)
    return proc, base, port


def _stop(proc):
    """Stop a ``_start_serve`` process (first woken, if a test stopped it with SIGSTOP)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
    stop_process_group(proc, 10)
    if proc.stderr:
        proc.stderr.close()


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_listen_backlog_is_normal(upstream_url):
    """With the process stopped, 100 connects must all complete in the kernel's backlog (a backlog
    of 5 left most of them waiting for SYN retransmits)."""
    proc, _, port = _start_serve(upstream_url)
    socks = []
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        ok = 0
        for _ in range(100):
            s = socket.socket()
            s.settimeout(0.5)
            try:
                s.connect(("127.0.0.1", port))
                ok += 1
            except OSError:
                pass
            socks.append(s)
        assert ok == 100
    finally:
        for s in socks:
            s.close()
        _stop(proc)


def test_slowloris_connections_are_dropped_at_the_request_timeout(upstream_url):
    proc, base, port = _start_serve(upstream_url, "--request-timeout", "1")
    socks = []
    try:
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
            socks.append(s)
        t0 = time.monotonic()
        closed = set()
        while len(closed) < len(socks) and time.monotonic() - t0 < 20:
            for i, s in enumerate(socks):
                if i in closed:
                    continue
                try:
                    s.sendall(b"a")
                    s.setblocking(False)
                    try:
                        if s.recv(4096) == b"":
                            closed.add(i)
                        else:
                            closed.add(i)  # an answer (408) and then close
                    except BlockingIOError:
                        pass
                    finally:
                        s.setblocking(True)
                except OSError:
                    closed.add(i)
            time.sleep(0.3)
        assert len(closed) == len(socks), f"{len(socks) - len(closed)} slowloris connections still held"
        # dropped at the 1 s request timeout, not held (before: 60 s and more); the bound is loose
        # because a loaded 2-core machine delays the listener's sweeps
        assert time.monotonic() - t0 < 15
        assert requests.get(base + "/metrics", timeout=5).status_code == 200
    finally:
        for s in socks:
            s.close()
        _stop(proc)


def test_huge_unfinished_headers_are_refused_without_holding_memory(upstream_url):
    proc, base, port = _start_serve(upstream_url)
    rss0 = _rss_mb(proc.pid)
    line = b"X-Big: " + b"a" * 65000 + b"\r\n"  # under http.server's 64 KiB line and 100-header limits
    socks = []
    try:
        for _ in range(30):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
            try:
                for _ in range(90):  # 5.9 MB of headers, never finished
                    s.sendall(line)
            except OSError:
                pass  # the exporter answered 431 and closed: expected
            socks.append(s)
        time.sleep(0.5)
        grown = _rss_mb(proc.pid) - rss0
        assert grown < 60, f"RSS grew {grown:.0f} MB"  # the code before: about 1 GB
        assert requests.get(base + "/metrics", timeout=10).status_code == 200
    finally:
        for s in socks:
            s.close()
        _stop(proc)


def test_a_thousand_held_connections_then_normal_service(upstream_url):
    proc, base, port = _start_serve(upstream_url, nofile=1024)
    socks = []
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    try:
        for _ in range(1000):
            with contextlib.suppress(OSError):
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        t0 = time.monotonic()
        try:
            r = requests.get(base + "/metrics", timeout=5)
            assert r.status_code in (200, 503)
        except requests.ConnectionError:
            pass  # closed at once: allowed beyond the limit
        assert time.monotonic() - t0 < 5
        for s in socks:
            s.close()
        socks = []
        time.sleep(0.5)
        cpu0 = _cpu_seconds(proc.pid)
        t0 = time.monotonic()
        r = requests.get(base + "/metrics", timeout=5)
        assert r.status_code == 200 and time.monotonic() - t0 < 2
        assert _up(r.text) == {"good": 1.0}
        time.sleep(2)
        assert _cpu_seconds(proc.pid) - cpu0 < 1.0, "the exporter keeps spinning after the flood"
    finally:
        for s in socks:
            s.close()
        _stop(proc)


def test_more_concurrent_requests_than_the_limit_get_503(upstream_url):
    proc, base, _ = _start_serve(upstream_url, "--upstream", f"slow={upstream_url}/slow", "--max-requests", "1")
    try:
        codes = []

        def get():
            try:
                codes.append(requests.get(base + "/metrics", timeout=20).status_code)
            except requests.RequestException as exc:
                codes.append(repr(exc))

        threads = [threading.Thread(target=get) for _ in range(2)]
        for t in threads:
            t.start()
            time.sleep(0.5)  # the first request holds the only slot for the slow upstream's 3 s
        for t in threads:
            t.join()
        assert sorted(codes, key=str) == [200, 503], codes
    finally:
        _stop(proc)


def test_ipv6_listen_address(upstream_url):
    try:
        _free_port(socket.AF_INET6, "::1")
    except OSError:
        pytest.skip("no IPv6 loopback")
    proc, base, _ = _start_serve(upstream_url, listen="::1")
    try:
        r = requests.get(base + "/metrics", timeout=10)
        assert r.status_code == 200 and _up(r.text) == {"good": 1.0}
    finally:
        _stop(proc)


@pytest.mark.parametrize("listen,needle", [
    ("192.0.2.1:{port}", "cannot listen"),       # TEST-NET-1: not an address of this host
    ("127.0.0.1:١٢٣", "listen address"),        # non-ASCII digits
    ("no-such-host.invalid:{port}", "cannot listen"),
])
def test_bad_listen_addresses_exit_2_with_one_line(listen, needle):
    r = subprocess.run([sys.executable, "-m", "specwatch", "serve", "--upstream", "http://127.0.0.1:1",
                        "--listen-address", listen.format(port=_free_port())],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
