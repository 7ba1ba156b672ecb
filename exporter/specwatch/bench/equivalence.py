"""Greedy-output equivalence check between a baseline and a speculative server.

Speculative decoding is lossless in exact arithmetic, so greedy outputs should match the
baseline's; in practice the verify step's different batch shapes change floating-point results and
outputs can diverge: vLLM's speculative-decoding documentation ("lossless guarantees") says batched
verification and floating-point precision can make outputs differ. The count is therefore a
measurement of one run, not a guarantee (the published n-gram measurement saw 10/12 identical on vLLM 0.31, 12/12 on 0.32;
a fresh-clone run of the demo on 0.32 read 11/12). For each prompt that differs the result names
the first differing token of both outputs (:func:`first_differing_token`). The check sends
fixed prompts (6 copy + 6 word-chain, greedy, 128 tokens with ``ignore_eos`` — as the published n-gram measurement) one at a
time to each server (concurrency 1, so batch composition cannot differ between servers), then
compares the generated texts character by character.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Sequence

import aiohttp

from specwatch.bench.backend import OpenAIBackend, RequestOutcome
from specwatch.bench.records import Equivalence, EquivalencePrompt
from specwatch.bench.workloads import BenchRequest, equivalence_requests


def first_difference(a: str, b: str) -> int | None:
    """Index of the first character where ``a`` and ``b`` differ; ``min(len)`` when one is a
    strict prefix of the other; None when identical."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    if len(a) != len(b):
        return min(len(a), len(b))
    return None


#: Characters of context kept on each side of a text-level difference (no tokenizer reachable).
SNIPPET_CHARS = 24


def _piece_at(text: str, pos: int) -> str:
    """The whitespace-delimited piece of ``text`` that holds character ``pos`` (its leading space
    kept, as BPE tokens carry it), at most :data:`SNIPPET_CHARS` long; "" past the end."""
    if pos >= len(text):
        return ""
    start = pos
    while start > 0 and not text[start - 1].isspace() and pos - start < SNIPPET_CHARS:
        start -= 1
    while start > 0 and text[start - 1].isspace() and pos - start < SNIPPET_CHARS:
        start -= 1
    m = re.match(r"\s*\S*", text[start:])
    return (m.group(0) if m else "")[:SNIPPET_CHARS] or text[pos:pos + 1]


def text_difference(a: str, b: str, pos: int) -> dict[str, Any]:
    """The first difference at character ``pos`` as the piece of each text there (the "token" when
    no tokenizer is reachable): ``{"index": None, "baseline": …, "speculative": …, "source": "text"}``."""
    return {"index": None, "baseline": _piece_at(a, pos), "speculative": _piece_at(b, pos), "source": "text"}


@dataclass(frozen=True)
class PromptComparison:
    """One prompt's result. ``identical`` is False also when either request failed (``error``)."""

    name: str
    identical: bool
    first_difference: int | None
    baseline_chars: int
    speculative_chars: int
    error: str | None = None
    #: The first differing token: ``{"index": token index or None, "baseline": text, "speculative":
    #: text, "source": "tokenizer" (the server's /tokenize) | "text" (the piece of text there)}``.
    first_token: dict[str, Any] | None = None

    def to_record(self) -> EquivalencePrompt:
        """This prompt's record (one of ``equivalence.prompts`` in a result file)."""
        return EquivalencePrompt(name=self.name, identical=self.identical, first_difference=self.first_difference,
                                 baseline_chars=self.baseline_chars, speculative_chars=self.speculative_chars,
                                 error=self.error, first_differing_token=self.first_token)


def compare_outputs(requests: Sequence[BenchRequest], baseline: Sequence[RequestOutcome],
                    speculative: Sequence[RequestOutcome]) -> Equivalence:
    """Compare outcomes pairwise (one :class:`PromptComparison` per request, in order): the
    :class:`specwatch.bench.records.Equivalence` record, ``matched`` of ``total`` identical."""
    prompts = []
    for req, b, s in zip(requests, baseline, speculative, strict=True):
        name = f"{req.workload}-{req.index}"
        err = "; ".join(f"{role}: {o.error}" for role, o in (("baseline", b), ("speculative", s)) if not o.success)
        if err:
            prompts.append(PromptComparison(name, False, None, len(b.generated_text), len(s.generated_text), err))
            continue
        pos = first_difference(b.generated_text, s.generated_text)
        prompts.append(PromptComparison(name, pos is None, pos, len(b.generated_text), len(s.generated_text),
                                        first_token=None if pos is None else text_difference(b.generated_text, s.generated_text, pos)))
    return Equivalence(matched=sum(p.identical for p in prompts), total=len(prompts),
                       prompts=tuple(p.to_record() for p in prompts))


async def run_sequential(backend: OpenAIBackend, requests: Sequence[BenchRequest]) -> list[RequestOutcome]:
    """Send ``requests`` one after another (concurrency 1)."""
    return [await backend.send(r) for r in requests]


async def _post(backend: OpenAIBackend, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
    """POST ``body`` to ``backend``'s root + ``path``; the JSON answer, or None on any failure."""
    try:
        async with (aiohttp.ClientSession(headers=getattr(backend, "_headers", {}),
                                          timeout=aiohttp.ClientTimeout(total=30)) as session,
                    session.post(backend.base_url + path, json=body) as r):
            if r.status != 200:
                return None
            out = await r.json(content_type=None)
            return out if isinstance(out, dict) else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def first_differing_token(backend: OpenAIBackend, a: str, b: str) -> dict[str, Any] | None:
    """The first token where outputs ``a`` (baseline) and ``b`` (speculative) differ, tokenized by
    ``backend``'s own tokenizer (vLLM's ``POST /tokenize`` and ``/detokenize``):
    ``{"index": i, "baseline": text of a's token i, "speculative": text of b's token i,
    "source": "tokenizer"}`` ("" for a token past the end of the shorter output). None when the
    server has no such endpoints (then the text-level piece stays) or the token ids agree."""
    ids = []
    for text in (a, b):
        got = await _post(backend, "/tokenize", {"model": backend.model, "prompt": text, "add_special_tokens": False})
        toks = (got or {}).get("tokens")
        if not isinstance(toks, list) or not all(isinstance(t, int) for t in toks):
            return None
        ids.append(toks)
    ta, tb = ids
    i = next((j for j, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), min(len(ta), len(tb)))
    if i >= len(ta) and i >= len(tb):
        return None
    texts = []
    for toks in (ta, tb):
        if i >= len(toks):
            texts.append("")
            continue
        got = await _post(backend, "/detokenize", {"model": backend.model, "tokens": [toks[i]]})
        if not isinstance((got or {}).get("prompt"), str):
            return None
        texts.append(got["prompt"])
    return {"index": i, "baseline": texts[0], "speculative": texts[1], "source": "tokenizer"}


async def check_equivalence(baseline: OpenAIBackend, speculative: OpenAIBackend, *,
                            output_len: int = 128, count_per_kind: int = 6, seed: int = 0) -> Equivalence:
    """Run the fixed greedy prompts on the baseline, then on the speculative server (never both
    at once), and compare (see :func:`compare_outputs`); each differing prompt's first differing
    token from the baseline server's tokenizer where it has one. Request failures are reported per
    prompt, never raised. Returns the record with ``output_len`` (tokens per prompt)."""
    reqs = equivalence_requests(output_len=output_len, count_per_kind=count_per_kind, seed=seed)
    base = await run_sequential(baseline, reqs)
    spec = await run_sequential(speculative, reqs)
    result = compare_outputs(reqs, base, spec)
    prompts = []
    for p, b, sp in zip(result.prompts, base, spec, strict=True):
        if p.first_difference is not None and not p.error:
            tok = await first_differing_token(baseline, b.generated_text, sp.generated_text)
            if tok is not None:
                p = replace(p, first_differing_token=tok)
        prompts.append(p)
    return replace(result, prompts=tuple(prompts), output_len=output_len)
