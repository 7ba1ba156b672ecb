"""Parse a vLLM (or llama.cpp) ``/metrics`` body into speculative-decoding counters.

The exposition text is parsed with :mod:`prometheus_client.parser`; this module only picks the
samples it needs and checks them. Supported upstream schemas (see ``shared/vllm-facts.md``):

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
``none``
    a vLLM (or llama.cpp) server that exports no spec-decode samples: speculation is off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from specwatch.common.defaults import MAX_METRICS_BODY_BYTES

#: Largest /metrics body accepted, in bytes (a vLLM body is tens of KiB).
DEFAULT_MAX_BODY_BYTES = MAX_METRICS_BODY_BYTES

SCHEMAS = ("v1", "v1-early", "v0", "llamacpp", "none")


class MetricsParseError(ValueError):
    """The body is not a usable vLLM /metrics exposition (garbage, truncated, NaN counters…)."""


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
class UpstreamSnapshot:
    """What one fetch of an upstream's /metrics says about speculative decoding.

    ``counters`` maps ``(model_name, engine)`` to :class:`SpecDecodeCounters` (empty for ``v0`` and
    ``none``); ``v0`` maps model_name to :class:`V0Gauges`; ``running_requests`` maps
    ``(model_name, engine)`` to ``vllm:num_requests_running`` (batch size, used by the cost model).
    """

    schema: str
    counters: dict[tuple[str, str], SpecDecodeCounters] = field(default_factory=dict)
    v0: dict[str, V0Gauges] = field(default_factory=dict)
    running_requests: dict[tuple[str, str], float] = field(default_factory=dict)

    @property
    def spec_decode_enabled(self) -> bool:
        """True when the upstream exports spec-decode samples."""
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


def _finite(name: str, value: float) -> float:
    if math.isnan(value) or math.isinf(value):
        raise MetricsParseError(f"{name} has a non-finite value {value!r}")
    return value


def parse_metrics(text: str, *, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> UpstreamSnapshot:
    """Parse one /metrics body (Prometheus text format 0.0.4) into an :class:`UpstreamSnapshot`.

    Samples are read with ``prometheus_client.parser.text_string_to_metric_families``; the
    ``…_created`` gauges are ignored.

    Raises :class:`MetricsParseError` when the body is larger than ``max_bytes``, does not parse,
    holds no ``vllm:``/``llamacpp:`` sample at all (an HTML page, an unrelated exporter), has a
    NaN/Inf spec-decode counter, or has an incomplete spec-decode schema (e.g. drafts without
    accepted tokens, a gap in the positions).
    """
    if len(text) > max_bytes:
        raise MetricsParseError(f"body of {len(text)} bytes exceeds the {max_bytes}-byte cap")
    samples: list[tuple[str, dict[str, str], float]] = []
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.append((s.name, s.labels, float(s.value)))
    except Exception as exc:  # the parser raises ValueError, IndexError, TypeError… on garbage
        raise MetricsParseError(f"unparseable exposition text: {type(exc).__name__}: {exc}") from exc

    if not any(name.startswith(("vllm:", "llamacpp:")) for name, _, _ in samples):
        raise MetricsParseError("no vllm: or llamacpp: samples: not a vLLM /metrics body")

    names = {name for name, _, _ in samples}
    for prefix, schema in (("vllm:", "v1"), ("llamacpp:", "llamacpp")):
        if prefix + _V1_NAMES["drafts"] in names:
            return _parse_v1(samples, prefix, schema)
    if _V0_RATE in names or _V0_EFFICIENCY in names or _V0_EMITTED in names:
        return _parse_v0(samples)
    for prefix in ("vllm:", "llamacpp:"):
        if prefix + _V1_NAMES["draft_tokens"] in names or prefix + _V1_NAMES["accepted_tokens"] in names:
            return _parse_v1(samples, prefix, "v1-early" if prefix == "vllm:" else "llamacpp")
    return UpstreamSnapshot(schema="none", running_requests=_running(samples, "vllm:"))


def _key(labels: dict[str, str]) -> tuple[str, str]:
    return (labels.get("model_name", ""), labels.get("engine", ""))


def _running(samples, prefix: str) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for name, labels, value in samples:
        if name == prefix + "num_requests_running" and math.isfinite(value):
            out[_key(labels)] = out.get(_key(labels), 0.0) + value
    return out


def _parse_v1(samples, prefix: str, schema: str) -> UpstreamSnapshot:
    per_key: dict[tuple[str, str], dict] = {}
    gen: dict[tuple[str, str], float] = {}
    wanted = {prefix + v: k for k, v in _V1_NAMES.items()}
    for name, labels, value in samples:
        if name == prefix + "generation_tokens_total":
            gen[_key(labels)] = gen.get(_key(labels), 0.0) + _finite(name, value)
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
                raise MetricsParseError(f"{name} is repeated for {_key(labels)}")
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
    return UpstreamSnapshot(schema=schema, counters=counters, running_requests=_running(samples, prefix))


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
    return UpstreamSnapshot(schema="v0", v0=v0, running_requests=_running(samples, "vllm:"))
