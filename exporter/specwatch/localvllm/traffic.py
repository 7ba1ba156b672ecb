"""Copy-like traffic for the embedded vLLM: completions whose prompt holds a text and a first copy
of it ("Copy 1: … Copy 2:"), the workload on which ngram speculation accepts almost every draft
token. Used by the tests and the fixture-capture scripts (``scripts/capture_fixtures.py``,
``scripts/capture_perrequest.py``)."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import requests

from specwatch.localvllm.server import DEFAULT_SERVED_MODEL_NAME

COPY_TEXTS: tuple[str, ...] = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He wound the clockwork, "
    "trimmed the wick and polished the great lens until it shone. Ships passing the reef at night "
    "saw the beam sweep across the water twice a minute, and they knew where the rocks were.",
    "To make bread, mix five hundred grams of flour with ten grams of salt and seven grams of yeast. "
    "Add three hundred and fifty millilitres of warm water and knead for ten minutes. Let the dough "
    "rise for an hour, shape it into a loaf, and bake it at two hundred and twenty degrees for thirty minutes.",
    "The river starts as a spring high in the mountains, runs through pine forests and narrow "
    "gorges, and widens as it reaches the plain. Farmers along its banks grow wheat, barley and "
    "sunflowers. In spring the snowmelt swells it, and in late summer it slows to a quiet stream.",
    "Our office will be closed on Monday for the public holiday. Orders placed over the weekend "
    "will be shipped on Tuesday morning. If you need help before then, please write to the support "
    "team and include your order number, the item name and a short description of the problem.",
    "A train left the station at nine in the morning, travelling north at eighty kilometres per "
    "hour. It stopped at four small towns, picked up the mail, and arrived at the coast shortly "
    "after two in the afternoon, where the passengers walked down to the harbour to watch the boats.",
    "The committee met on Thursday to review the budget. It approved new chairs for the library, "
    "postponed the repairs to the roof until the autumn, and asked the treasurer to prepare a "
    "report on the cost of heating the hall during the winter months for the next meeting.",
)


def copy_prompt(text: str) -> str:
    """A completion prompt holding ``text`` and a first copy of it, ending at ``Copy 2:`` — the
    model continues by copying again, which ngram prompt lookup drafts almost perfectly."""
    return (
        "Repeat the text below exactly, three times.\n\n"
        f"Text: {text}\n\nCopy 1: {text}\n\nCopy 2:"
    )


def send_copy_traffic(
    base_url: str,
    model: str = DEFAULT_SERVED_MODEL_NAME,
    n: int = 8,
    concurrency: int = 4,
    max_tokens: int = 256,
    timeout: float = 600.0,
) -> list[dict[str, Any]]:
    """Send ``n`` greedy copy-like completions (``POST /v1/completions``, temperature 0,
    ``max_tokens`` each, ``ignore_eos`` so every request produces ``max_tokens`` tokens) with
    ``concurrency`` requests in flight.

    Returns:
        The ``n`` response JSON objects (OpenAI completion format), in request order.

    Raises:
        requests.HTTPError: a request failed (the server's message is in the error).
    """
    def one(i: int) -> dict[str, Any]:
        body = {
            "model": model,
            "prompt": copy_prompt(COPY_TEXTS[i % len(COPY_TEXTS)]),
            "max_tokens": int(max_tokens),
            "temperature": 0.0,
            "ignore_eos": True,
        }
        r = requests.post(base_url.rstrip("/") + "/v1/completions", json=body, timeout=timeout)
        if r.status_code != 200:
            raise requests.HTTPError(f"completion {i} failed: HTTP {r.status_code}: {r.text[:500]}", response=r)
        return r.json()

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, int(concurrency))) as pool:
        return list(pool.map(one, range(int(n))))
