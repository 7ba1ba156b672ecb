"""Parse a vLLM (or llama.cpp) ``/metrics`` body into speculative-decoding counters.

The exposition text is parsed with :mod:`prometheus_client.parser`; this module only picks the
samples it needs and checks them. Supported upstream schemas (the user-facing list is
``docs/exporter.md``, "Supported upstreams"):

``v1``
    vLLM 0.8.5 and later: ``vllm:spec_decode_num_drafts_total``, ``…_num_draft_tokens_total``,
    ``…_num_accepted_tokens_total``, ``…_num_accepted_tokens_per_pos_total{position}``; labels
    ``model_name`` and (0.11.0+) ``engine``.
``llamacpp``
    llama.cpp's server: the same schema under the ``llamacpp:`` prefix.
``v1-early``
    vLLM 0.8.3–0.8.4: only ``…_num_draft_tokens_total`` and ``…_num_accepted_tokens_total``.
``v0``
    vLLM 0.5.3–0.9.2 legacy metrics: gauges ``vllm:spec_decode_draft_acceptance_rate`` and
    ``vllm:spec_decode_efficiency``; its counters were incremented by cumulative values (a bug
    never fixed), so only the gauges and ratios of counters are used.
``sglang``
    SGLang (checked against 0.5.23's ``python/sglang/srt/observability/metrics_collector.py``):
    ``sglang:``-prefixed gauges ``spec_accept_length``, ``spec_accept_rate``, ``spec_cap_length``,
    ``spec_block_accept_length``, ``spec_num_steps``, ``spec_num_draft_tokens`` (scheduler side,
    labels ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank``, optional
    ``dp_rank``; "most recent" values of the last logged batch) and the counters
    ``sglang:generation_tokens_total``, ``sglang:num_requests_total`` (label ``is_streaming``) and
    ``sglang:spec_verify_calls_total`` (tokenizer side, labels ``model_name``, ``engine_type``), all
    three incremented when a request finishes. No per-position series. See :class:`SglangCounters`.
``none``
    a vLLM (or llama.cpp) server that exports no spec-decode samples: speculation is off.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from specwatch.common.defaults import MAX_METRICS_BODY_BYTES

#: Largest /metrics body accepted, in bytes (a vLLM body is tens of KiB).
DEFAULT_MAX_BODY_BYTES = MAX_METRICS_BODY_BYTES

SCHEMAS = ("v1", "v1-early", "v0", "llamacpp", "sglang", "none")


class MetricsParseError(ValueError):
    """The body is not a usable vLLM /metrics exposition (garbage, truncated, NaN counters…).

    ``reason`` is the exporter's short label for it: ``parse`` (the text is not a usable
    exposition) or ``invalid_value`` (it parses, but a value the exporter reads is negative,
    non-finite or duplicated)."""

    reason = "parse"


class InvalidValueError(MetricsParseError):
    """A sample the exporter reads is negative, non-finite (NaN/±Inf) or duplicated."""

    reason = "invalid_value"


@dataclass(frozen=True)
class SpecDecodeCounters:
    """Spec-decode counters of one (model_name, engine) of one upstream.

    Values are counts since the server started (or, after :func:`specwatch.specdecode.derive.counters_delta`,
    increases over an interval). Sources (vLLM V1 metric names; ``llamacpp:`` alike):

    - ``drafts``: ``vllm:spec_decode_num_drafts_total`` — verify steps that carried at least one
      draft token; ``None`` where the upstream does not export it (vLLM 0.8.3–0.8.4).
    - ``draft_tokens``: ``vllm:spec_decode_num_draft_tokens_total``.
    - ``accepted_tokens``: ``vllm:spec_decode_num_accepted_tokens_total`` (bonus token excluded).
    - ``accepted_per_position``: ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position=i}``
      for i = 0 … k-1, i.e. drafts whose first i+1 tokens were all accepted; ``()`` if absent.
    - ``generation_tokens``: ``vllm:generation_tokens_total`` (all output tokens), if present.
    """

    model_name: str
    engine: str
    drafts: float | None
    draft_tokens: float
    accepted_tokens: float
    accepted_per_position: tuple[float, ...] = ()
    generation_tokens: float | None = None

    @property
    def key(self) -> tuple[str, str]:
        """``(model_name, engine)``."""
        return (self.model_name, self.engine)

    @property
    def num_speculative_tokens(self) -> int | None:
        """k (``num_speculative_tokens``) as revealed by the number of ``position`` labels, or None."""
        return len(self.accepted_per_position) or None


@dataclass(frozen=True)
class V0Gauges:
    """The legacy V0 gauges of one model: ``vllm:spec_decode_draft_acceptance_rate`` and
    ``vllm:spec_decode_efficiency`` (0–1 ratios, "most recent" values), plus the lifetime ratio
    of its counters ``num_accepted_tokens_total / num_draft_tokens_total`` (usable although the
    counters' rates are not)."""

    model_name: str
    draft_acceptance_rate: float | None
    efficiency: float | None
    counter_acceptance_ratio: float | None


@dataclass(frozen=True)
class StepCounters:
    """Engine-step counters of one (model_name, engine) of one upstream, cumulative since the
    server started (vLLM V1; ``None`` where the upstream does not export the family):

    - ``itl_sum`` / ``itl_count``: ``vllm:inter_token_latency_seconds_sum`` / ``_count`` (seconds;
      one observation per running request per engine step: time since its previous output);
    - ``iteration_count``: ``vllm:iteration_tokens_total_count`` (one observation per engine step);
    - ``ttft_count``: ``vllm:time_to_first_token_seconds_count`` (first tokens, one per request);
    - ``generation_tokens``: ``vllm:generation_tokens_total`` (all output tokens);
    - ``ttft_sum``: ``vllm:time_to_first_token_seconds_sum`` (seconds of prefill and queueing);
    - ``prompt_tokens_sum`` / ``prompt_requests``: ``vllm:request_prompt_tokens_sum`` / ``_count``
      and ``output_tokens_sum`` / ``output_requests``: ``vllm:request_generation_tokens_sum`` /
      ``_count`` (finished requests; the context a running request carries).
    """

    itl_sum: float | None = None
    itl_count: float | None = None
    iteration_count: float | None = None
    ttft_count: float | None = None
    generation_tokens: float | None = None
    ttft_sum: float | None = None
    prompt_tokens_sum: float | None = None
    prompt_requests: float | None = None
    output_tokens_sum: float | None = None
    output_requests: float | None = None


@dataclass(frozen=True)
class SglangCounters:
    """SGLang's request-finish counters of one ``model_name``, summed over every other label
    (``is_streaming``, ``engine_type``, ranks, extra labels) before any division:

    - ``generation_tokens``: ``sglang:generation_tokens_total`` (output tokens of finished requests);
    - ``finished_requests``: ``sglang:num_requests_total`` (finished requests);
    - ``verify_calls``: ``sglang:spec_verify_calls_total`` (verify forward passes of finished
      requests; each request's first token comes from prefill, not from a verify).

    Mean acceptance length over an interval (tokens per verify step, bonus included) =
    (Δgeneration_tokens − Δfinished_requests) / Δverify_calls. ``verify_calls`` is ``None`` while
    no speculative request has finished (prometheus_client prints no sample before the first
    increment)."""

    model_name: str
    generation_tokens: float
    finished_requests: float
    verify_calls: float | None

    @property
    def mean_acceptance_length(self) -> float | None:
        """(generation_tokens − finished_requests) / verify_calls, or None (no verify call)."""
        if not self.verify_calls or self.verify_calls <= 0:
            return None
        value = (self.generation_tokens - self.finished_requests) / self.verify_calls
        return value if value >= 0 else None


@dataclass(frozen=True)
class SglangGauges:
    """SGLang's speculative gauges of one scheduler (``model_name`` and ``rank``, a string such as
    ``"tp0 pp0 dp1"`` built from its rank labels): "most recent" values of the last logged decode
    batch, which cannot be windowed or summed. ``None`` where absent or NaN.

    - ``accept_rate``: ``sglang:spec_accept_rate`` = accepted drafts / (verify steps × the
      *configured* draft width) in the batch: wrong under adaptive speculation (the width varies);
    - ``accept_length``: ``sglang:spec_accept_length`` (tokens per verify step, bonus included);
    - ``others``: ``spec_cap_length``, ``spec_block_accept_length``, ``spec_num_steps``,
      ``spec_num_draft_tokens`` by short name."""

    model_name: str
    rank: str
    accept_rate: float | None
    accept_length: float | None
    others: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class UpstreamSnapshot:
    """What one fetch of an upstream's /metrics says about speculative decoding.

    ``counters`` maps ``(model_name, engine)`` to :class:`SpecDecodeCounters` (empty for ``v0`` and
    ``none``); ``v0`` maps model_name to :class:`V0Gauges`; ``running_requests`` maps
    ``(model_name, engine)`` to ``vllm:num_requests_running`` (batch size, used by the cost model);
    ``steps`` maps ``(model_name, engine)`` to :class:`StepCounters` (every schema; empty for
    servers without those families); ``process_start_time`` is ``process_start_time_seconds``
    (Unix seconds) when exported: a change means the server restarted.
    """

    schema: str
    counters: dict[tuple[str, str], SpecDecodeCounters] = field(default_factory=dict)
    v0: dict[str, V0Gauges] = field(default_factory=dict)
    running_requests: dict[tuple[str, str], float] = field(default_factory=dict)
    steps: dict[tuple[str, str], StepCounters] = field(default_factory=dict)
    process_start_time: float | None = None
    sglang: dict[str, SglangCounters] = field(default_factory=dict)
    sglang_gauges: dict[tuple[str, str], SglangGauges] = field(default_factory=dict)

    @property
    def spec_decode_enabled(self) -> bool:
        """True when the upstream exports spec-decode samples (SGLang: a verify call counted, or
        a non-zero ``spec_num_steps``/``spec_num_draft_tokens``/``spec_accept_length`` gauge; its
        gauges exist, at 0, without speculation too)."""
        if self.schema == "sglang":
            return any(c.verify_calls for c in self.sglang.values()) or any(
                g.accept_length or any(v for n, v in g.others if n in ("spec_num_steps", "spec_num_draft_tokens"))
                for g in self.sglang_gauges.values())
        return self.schema != "none"


_V1_NAMES = {
    "drafts": "spec_decode_num_drafts_total",
    "draft_tokens": "spec_decode_num_draft_tokens_total",
    "accepted_tokens": "spec_decode_num_accepted_tokens_total",
    "per_pos": "spec_decode_num_accepted_tokens_per_pos_total",
}
_V0_RATE = "vllm:spec_decode_draft_acceptance_rate"
_V0_EFFICIENCY = "vllm:spec_decode_efficiency"
_V0_EMITTED = "vllm:spec_decode_num_emitted_tokens_total"


#: Lines of the families the exporter reads (matched before the full parser runs, so a body's
#: parse cost is one regular-expression scan plus the few dozen lines kept).
_WANTED_LINE = re.compile(
    r"^(?:(?:vllm|llamacpp):(?:spec_decode_[A-Za-z0-9_]*|generation_tokens_total|num_requests_running"
    r"|inter_token_latency_seconds_(?:sum|count)|iteration_tokens_total_count|time_to_first_token_seconds_(?:sum|count)"
    r"|request_prompt_tokens_(?:sum|count)|request_generation_tokens_(?:sum|count))"
    r"|sglang:(?:spec_[A-Za-z0-9_]*|generation_tokens_total|num_requests_total|num_running_reqs)"
    r"|process_start_time_seconds)[{ \t][^\n]*",
    re.M,
)
_ANY_SAMPLE = re.compile(r"^(?:vllm|llamacpp|sglang):", re.M)
#: Most lines of the read families accepted from one body (vLLM 0.32 with k=8 has about 40).
MAX_READ_LINES = 20000
#: Longest kept line (characters) of a family the exporter reads. vLLM's are under 200; a longer
#: one is no vLLM exposition. ``prometheus_client.parser`` copies the rest of a line once per
#: label and walks it character by character in Python, so its cost grows with line length
#: times label count (a 1.9 MiB line of short labels took 13.5 s, a 15 MiB one over 300 s):
#: this cap and :data:`MAX_LABELS_PER_LINE` bound it before the parser runs.
MAX_LINE_CHARS = 8192
#: Most labels on one kept line (vLLM uses at most 3: model_name, engine, position; SGLang 7).
MAX_LABELS_PER_LINE = 32
#: Most characters of all kept lines of one body together (about 15,000 short lines; vLLM 0.32
#: with k=8 keeps 2.8 KiB per engine). Bounds the parse: the costliest body within the limits,
#: 1 MiB of short lines, took 0.68 s (2-core machine, 2026-12-01; docs/exporter.md "Limits").
MAX_READ_CHARS = 1024 * 1024
_QUOTED = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_V0_GAUGES = ("vllm:spec_decode_draft_acceptance_rate", "vllm:spec_decode_efficiency")
#: SGLang's speculative gauges (NaN there means "no value": dropped like V0's).
_SGLANG_GAUGES = ("spec_accept_length", "spec_accept_rate", "spec_cap_length", "spec_block_accept_length",
                  "spec_num_steps", "spec_num_draft_tokens")
_NAN_MEANS_NONE = frozenset(_V0_GAUGES) | {"sglang:" + g for g in _SGLANG_GAUGES}
#: The largest SGLang token-count gauge accepted (draft tokens, steps, accept and cap lengths are
#: tokens per verify step: tens at most; a value beyond this is no SGLang reading).
MAX_SGLANG_TOKENS = 4096
#: Ranges of the gauges read (inclusive): a value outside is :class:`InvalidValueError`, as a
#: negative counter is. ``spec_accept_length`` is 0 (no speculation: the gauge exists at 0) or
#: at least 1 (the bonus token).
_GAUGE_RANGES = {
    **{g: (0.0, 1.0) for g in _V0_GAUGES},
    "sglang:spec_accept_rate": (0.0, 1.0),
    **{"sglang:" + g: (0.0, float(MAX_SGLANG_TOKENS)) for g in _SGLANG_GAUGES if g != "spec_accept_rate"},
}
#: A sample value or timestamp as the text format writes it (Go's ParseFloat and Python's float()
#: alike): a decimal number, ``NaN``, ``+Inf`` / ``-Inf``.
_NUMBER = (r"[-+]?(?:(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?"
           r"|[Ii][Nn][Ff](?:[Ii][Nn][Ii][Tt][Yy])?|[Nn][Aa][Nn])")
#: One exposition line: a comment (``# HELP``, ``# TYPE``, ``# EOF``…), a blank line, or a sample
#: ``name{labels} value [timestamp]`` (an OpenMetrics exemplar ``# {…} v`` after it allowed; a
#: quoted name inside the braces too). ``garbage here`` is none (its value is no number).
_EXPOSITION_LINE = (r"(?:[ \t]*(?:[a-zA-Z_:][a-zA-Z0-9_:]*(?:[ \t]*\{[^\n]*\})?|\{[^\n]*\})[ \t]+" + _NUMBER
                    + r"(?:[ \t]+" + _NUMBER + r")?(?:[ \t]+#[^\n]*)?[ \t\r]*|#[^\n]*|[ \t\r]*)")
#: The run of complete exposition lines at the start of a text. Possessive: one pass, no
#: backtracking state kept per line (linear time, constant memory; a vLLM body of 56 KB takes
#: 0.3 ms, 16 MiB of 4-character lines 2.5 s on a 2-core machine).
_EXPOSITION_RUN = re.compile(r"(?>" + _EXPOSITION_LINE + r"\n)*+")
_ONE_EXPOSITION_LINE = re.compile(_EXPOSITION_LINE)


def find_non_exposition_line(text: str, end: int | None = None) -> str | None:
    """The first line of ``text[:end]`` that is neither a sample (``name{labels} value
    [timestamp]``, the value a number, ``NaN`` or ``±Inf``), a comment nor blank, or None. One
    regular-expression pass (no copy of the text). A last line without a newline is checked too."""
    end = len(text) if end is None else end
    stop = _EXPOSITION_RUN.match(text, 0, end).end()
    if stop >= end:
        return None
    nl = text.find("\n", stop, end)
    line = text[stop:end if nl < 0 else nl]
    if nl < 0 and _ONE_EXPOSITION_LINE.fullmatch(line):
        return None
    return line


_UNPRINTABLE = re.compile(r"[^\x20-\x7e\u2026]")  # "…" marks a cut


def clip(text: str, limit: int = 200) -> str:
    """``text`` made safe for one log line: every character that is not printable ASCII escaped
    once (``\\r``, ``\\x1b``, ``\\u00e9``…; a backslash is left as it is, so clipping a clipped
    text changes nothing), cut to about ``limit`` characters (``…`` marks a cut)."""
    out = _UNPRINTABLE.sub(lambda m: ascii(m.group())[1:-1], text[: limit * 2])
    return out if len(out) <= limit and len(text) <= limit * 2 else out[:limit] + "…"


def _finite(name: str, value: float) -> float:
    if math.isnan(value) or math.isinf(value):
        raise InvalidValueError(f"{name} has a non-finite value {value!r}")
    return value


def _metric_name(line: str) -> str:
    return clip(re.split(r"[{ \t]", line, maxsplit=1)[0], 80)


def _check_line_limits(lines: list[str]) -> None:
    """Bound what reaches ``prometheus_client.parser`` (see :data:`MAX_LINE_CHARS`): every kept
    line at most :data:`MAX_LINE_CHARS` characters with at most :data:`MAX_LABELS_PER_LINE`
    labels, all of them together at most :data:`MAX_READ_CHARS`. Linear in the kept text.
    Raises :class:`MetricsParseError` (reason ``parse``) naming the first line over a limit."""
    total = 0
    for line in lines:
        n = len(line)
        total += n
        if n > MAX_LINE_CHARS:
            raise MetricsParseError(f"a {_metric_name(line)} line of {n} characters: longer than the "
                                    f"{MAX_LINE_CHARS} accepted")
        # each label value is one quoted string; count them exactly only where a cheap upper
        # bound (every quote character opening a value) is over the limit
        if line.count('"') > 2 * MAX_LABELS_PER_LINE and len(_QUOTED.findall(line)) > MAX_LABELS_PER_LINE:
            raise MetricsParseError(f"a {_metric_name(line)} line with {len(_QUOTED.findall(line))} labels: more "
                                    f"than the {MAX_LABELS_PER_LINE} accepted")
    if total > MAX_READ_CHARS:
        raise MetricsParseError(f"{total} characters of spec-decode/engine lines: more than the "
                                f"{MAX_READ_CHARS} accepted")


def _read_samples(text: str, max_lines: int) -> list[tuple[str, dict[str, str], float]]:
    """The samples of the families the exporter reads, checked: finite, ≥ 0, no duplicate series
    (V0's NaN gauges are dropped: NaN there means "no value yet")."""
    lines = _WANTED_LINE.findall(text)
    if len(lines) > max_lines:
        raise MetricsParseError(f"{len(lines)} spec-decode/engine lines, more than the {max_lines} accepted")
    _check_line_limits(lines)
    samples: list[tuple[str, dict[str, str], float]] = []
    seen: set = set()
    try:
        families = list(text_string_to_metric_families("\n".join(lines) + "\n"))
    except Exception as exc:  # the parser raises ValueError, IndexError, TypeError… on garbage
        raise MetricsParseError(clip(f"unparseable exposition text: {type(exc).__name__}: {exc}")) from None
    for family in families:
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            value = float(s.value)
            if s.name in _NAN_MEANS_NONE and math.isnan(value):
                continue
            where = clip(f"{s.name}{s.labels}", 120)
            if not math.isfinite(value):
                raise InvalidValueError(f"{where} has a non-finite value {value!r}")
            if value < 0:
                raise InvalidValueError(f"{where} is negative ({value:g})")
            rng = _GAUGE_RANGES.get(s.name)
            if rng is not None and (not rng[0] <= value <= rng[1]
                                    or (s.name == "sglang:spec_accept_length" and 0 < value < 1)):
                raise InvalidValueError(f"{where} is {value:g}: outside its range "
                                        f"({'0 or 1' if s.name == 'sglang:spec_accept_length' else f'{rng[0]:g}'}"
                                        f" to {rng[1]:g})")
            ident = (s.name, tuple(sorted(s.labels.items())))
            if ident in seen:
                raise InvalidValueError(f"{where} is repeated")
            seen.add(ident)
            samples.append((s.name, s.labels, value))
    return samples


def parse_metrics(text: str, *, max_bytes: int = DEFAULT_MAX_BODY_BYTES,
                  max_lines: int = MAX_READ_LINES) -> UpstreamSnapshot:
    """Parse one /metrics body (Prometheus text format 0.0.4) into an :class:`UpstreamSnapshot`.

    Only the lines of the families the exporter reads (``vllm:spec_decode_*``,
    ``vllm:generation_tokens_total``, ``vllm:num_requests_running``, the ``_sum``/``_count`` of
    ``vllm:inter_token_latency_seconds``, ``vllm:iteration_tokens_total`` and
    ``vllm:time_to_first_token_seconds``, ``process_start_time_seconds``; ``llamacpp:`` alike)
    are kept by one regular-expression scan and then read with
    ``prometheus_client.parser.text_string_to_metric_families``; the ``…_created`` gauges are
    ignored. A leading UTF-8 byte-order mark is accepted.

    Raises :class:`MetricsParseError` when the body is larger than ``max_bytes``, holds more than
    ``max_lines`` lines of those families, a line of them longer than :data:`MAX_LINE_CHARS` or
    with more than :data:`MAX_LABELS_PER_LINE` labels, more than :data:`MAX_READ_CHARS` of them in
    all (these bound the parser's cost; see :data:`MAX_LINE_CHARS`), does not parse, holds no ``vllm:``/``llamacpp:`` sample
    at all (an HTML page, an unrelated exporter), or has an incomplete spec-decode schema (e.g.
    drafts without accepted tokens, a gap in the positions), holds no sample it reads and a line
    that is no exposition line (:func:`find_non_exposition_line`), mixes SGLang and vLLM/llama.cpp
    series (one URL is one server: reading either half alone would hide the other), or a label
    value that is not UTF-8 text; :class:`InvalidValueError` (a subclass) when a value it reads is
    NaN/Inf, negative, a repeated series, or a gauge outside its range (V0's rate and efficiency
    and SGLang's ``spec_accept_rate`` 0–1, ``spec_accept_length`` 0 or at least 1, SGLang's
    token gauges at most :data:`MAX_SGLANG_TOKENS`).
    """
    if len(text) > max_bytes:
        raise MetricsParseError(f"body of {len(text)} bytes exceeds the {max_bytes}-byte cap")
    if text.startswith("\ufeff"):
        text = text[1:]
    if not _ANY_SAMPLE.search(text):
        raise MetricsParseError("no vllm:, llamacpp: or sglang: samples: not a vLLM/SGLang /metrics body")
    samples = _read_samples(text, max_lines)

    names = {name for name, _, _ in samples}
    if not samples:
        bad = find_non_exposition_line(text)
        if bad is not None:
            raise MetricsParseError(f"not a /metrics exposition: a line reads '{clip(bad, 80)}'")
    start = next((v for n, _, v in samples if n == "process_start_time_seconds"), None)
    snap = _dispatch(samples, names)
    for key in list(snap.counters) + list(snap.steps) + list(snap.running_requests) + list(snap.sglang_gauges):
        for part in key:
            try:
                part.encode("utf-8")
            except UnicodeEncodeError:
                raise MetricsParseError(f"a label value is not UTF-8 text: {clip(part, 80)}") from None
    if start is not None:
        snap = dataclasses.replace(snap, process_start_time=start)
    return snap


def _dispatch(samples, names) -> UpstreamSnapshot:
    if any(n.startswith("sglang:") for n in names):
        other = sorted(n for n in names if n.startswith(("vllm:", "llamacpp:")))
        if other:
            # one URL, one server: a body of both is an aggregator or a misconfiguration, and
            # reading either half alone would hide the other one behind up 1
            raise MetricsParseError(f"the body mixes SGLang (sglang:) and vLLM/llama.cpp ({clip(other[0], 80)}, …) "
                                    "series: point each --upstream at one server")
        return _parse_sglang(samples, names)
    for prefix, schema in (("vllm:", "v1"), ("llamacpp:", "llamacpp")):
        if prefix + _V1_NAMES["drafts"] in names:
            return _parse_v1(samples, prefix, schema)
    if _V0_RATE in names or _V0_EFFICIENCY in names or _V0_EMITTED in names:
        return _parse_v0(samples)
    for prefix in ("vllm:", "llamacpp:"):
        if prefix + _V1_NAMES["draft_tokens"] in names or prefix + _V1_NAMES["accepted_tokens"] in names:
            return _parse_v1(samples, prefix, "v1-early" if prefix == "vllm:" else "llamacpp")
    prefix = "llamacpp:" if any(n.startswith("llamacpp:") for n in names) else "vllm:"
    return UpstreamSnapshot(schema="none", running_requests=_running(samples, prefix),
                            steps=_steps(samples, prefix))


_STEP_NAMES = {
    "inter_token_latency_seconds_sum": "itl_sum",
    "inter_token_latency_seconds_count": "itl_count",
    "iteration_tokens_total_count": "iteration_count",
    "time_to_first_token_seconds_count": "ttft_count",
    "generation_tokens_total": "generation_tokens",
    "time_to_first_token_seconds_sum": "ttft_sum",
    "request_prompt_tokens_sum": "prompt_tokens_sum",
    "request_prompt_tokens_count": "prompt_requests",
    "request_generation_tokens_sum": "output_tokens_sum",
    "request_generation_tokens_count": "output_requests",
}


def _steps(samples, prefix: str) -> dict[tuple[str, str], StepCounters]:
    """:class:`StepCounters` per (model_name, engine); series with other labels are summed."""
    acc: dict[tuple[str, str], dict[str, float]] = {}
    for name, labels, value in samples:
        if not name.startswith(prefix):
            continue
        field_name = _STEP_NAMES.get(name[len(prefix):])
        if field_name is None:
            continue
        d = acc.setdefault(_key(labels), {})
        d[field_name] = _finite(name, d.get(field_name, 0.0) + value)
    return {k: StepCounters(**d) for k, d in acc.items()}


def _key(labels: dict[str, str]) -> tuple[str, str]:
    return (labels.get("model_name", ""), labels.get("engine", ""))


def _running(samples, prefix: str) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for name, labels, value in samples:
        if name == prefix + "num_requests_running":
            out[_key(labels)] = _finite(name, out.get(_key(labels), 0.0) + value)
    return out


def _parse_v1(samples, prefix: str, schema: str) -> UpstreamSnapshot:
    per_key: dict[tuple[str, str], dict] = {}
    gen: dict[tuple[str, str], float] = {}
    wanted = {prefix + v: k for k, v in _V1_NAMES.items()}
    for name, labels, value in samples:
        if name == prefix + "generation_tokens_total":
            gen[_key(labels)] = _finite(name, gen.get(_key(labels), 0.0) + value)
            continue
        field_name = wanted.get(name)
        if field_name is None:
            continue
        value = _finite(name, value)
        if value < 0:
            raise MetricsParseError(f"{name}{labels} is negative ({value})")
        entry = per_key.setdefault(_key(labels), {"per_pos": {}})
        if field_name == "per_pos":
            pos_label = labels.get("position")
            try:
                pos = int(pos_label)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise MetricsParseError(f"{name} has a bad position label {pos_label!r}") from None
            if pos < 0 or pos in entry["per_pos"]:
                raise MetricsParseError(f"{name} has a negative or repeated position {pos}")
            entry["per_pos"][pos] = value
        else:
            if field_name in entry:
                raise InvalidValueError(f"{name} is repeated for {_key(labels)}")
            entry[field_name] = value

    counters: dict[tuple[str, str], SpecDecodeCounters] = {}
    for key, entry in per_key.items():
        missing = [f for f in ("draft_tokens", "accepted_tokens") if f not in entry]
        if schema != "v1-early" and "drafts" not in entry:
            missing.append("drafts")
        if missing:
            raise MetricsParseError(f"spec-decode series for {key} lack {', '.join(missing)}")
        positions = entry["per_pos"]
        if positions and sorted(positions) != list(range(len(positions))):
            raise MetricsParseError(f"positions for {key} are not 0..k-1: {sorted(positions)}")
        counters[key] = SpecDecodeCounters(
            model_name=key[0],
            engine=key[1],
            drafts=entry.get("drafts"),
            draft_tokens=entry["draft_tokens"],
            accepted_tokens=entry["accepted_tokens"],
            accepted_per_position=tuple(positions[i] for i in range(len(positions))),
            generation_tokens=gen.get(key),
        )
    return UpstreamSnapshot(schema=schema, counters=counters, running_requests=_running(samples, prefix),
                            steps=_steps(samples, prefix))


def _parse_v0(samples) -> UpstreamSnapshot:
    by_model: dict[str, dict[str, float]] = {}
    for name, labels, value in samples:
        short = {
            _V0_RATE: "rate",
            _V0_EFFICIENCY: "efficiency",
            "vllm:spec_decode_num_accepted_tokens_total": "accepted",
            "vllm:spec_decode_num_draft_tokens_total": "draft",
        }.get(name)
        if short is None:
            continue
        if math.isnan(value) or math.isinf(value):
            continue  # V0 gauges are NaN before the first step: treat as "no value yet"
        by_model.setdefault(labels.get("model_name", ""), {})[short] = value
    v0 = {}
    for model, vals in by_model.items():
        draft = vals.get("draft")
        ratio = vals["accepted"] / draft if draft and "accepted" in vals else None
        v0[model] = V0Gauges(
            model_name=model,
            draft_acceptance_rate=vals.get("rate"),
            efficiency=vals.get("efficiency"),
            counter_acceptance_ratio=ratio,
        )
    return UpstreamSnapshot(schema="v0", v0=v0, running_requests=_running(samples, "vllm:"),
                            steps=_steps(samples, "vllm:"))


def _sglang_rank(labels: dict[str, str]) -> str:
    return " ".join(f"{short}{labels[name]}" for name, short in
                    (("tp_rank", "tp"), ("pp_rank", "pp"), ("dp_rank", "dp"), ("moe_ep_rank", "ep")) if name in labels)


def _parse_sglang(samples, names) -> UpstreamSnapshot:
    """SGLang body (see the module doc). Counters are summed per ``model_name`` over all other
    labels; gauges are kept per (model_name, rank). Raises :class:`MetricsParseError` when verify
    calls are exported without the generation-token or finished-request counters (a partial body:
    the mean acceptance length cannot be formed)."""
    sums: dict[str, dict[str, float]] = {}
    gauges: dict[tuple[str, str], dict[str, float]] = {}
    running: dict[tuple[str, str], float] = {}
    short = {"sglang:generation_tokens_total": "gen", "sglang:num_requests_total": "fin",
             "sglang:spec_verify_calls_total": "verify"}
    for name, labels, value in samples:
        model = labels.get("model_name", "")
        if name in short:
            d = sums.setdefault(model, {})
            d[short[name]] = _finite(name, d.get(short[name], 0.0) + value)
        elif name == "sglang:num_running_reqs":
            if labels.get("priority", "") == "":  # per-priority breakdowns repeat the total
                running[(model, "")] = _finite(name, running.get((model, ""), 0.0) + value)
        elif name.startswith("sglang:spec_") and name[7:] in _SGLANG_GAUGES:
            rank = _sglang_rank(labels)
            g = gauges.setdefault((model, rank), {})
            if name[7:] in g:
                raise InvalidValueError(f"{name} is repeated for {model!r} {rank!r}")
            g[name[7:]] = value
    counters: dict[str, SglangCounters] = {}
    for model, d in sums.items():
        if "verify" in d and ("gen" not in d or "fin" not in d):
            missing = [n for n, f in (("sglang:generation_tokens_total", "gen"), ("sglang:num_requests_total", "fin")) if f not in d]
            raise MetricsParseError(f"SGLang series for {model!r} have spec_verify_calls_total but lack {', '.join(missing)}")
        if "gen" in d and "fin" in d:
            counters[model] = SglangCounters(model, d["gen"], d["fin"], d.get("verify"))
    kept = {k: SglangGauges(k[0], k[1], g.get("spec_accept_rate"), g.get("spec_accept_length"),
                            tuple((n, g[n]) for n in _SGLANG_GAUGES[2:] if n in g))
            for k, g in gauges.items()}
    return UpstreamSnapshot(schema="sglang", running_requests=running, sglang=counters, sglang_gauges=kept)
