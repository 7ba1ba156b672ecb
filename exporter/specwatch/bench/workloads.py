"""Workloads of the load generator: what each request sends (the published workloads).

A workload turns (batch index, number of prompts, options) into a list of frozen
:class:`BenchRequest` objects. Sampling is seeded with a string built from the run seed, the
workload name and the batch index, so every server (baseline and speculative) receives exactly
the same prompts, and re-running with the same ``--seed`` reproduces them. No tokenizer is
loaded: token-id prompts are drawn from ``range(vocab_size)`` and prompt lengths of text prompts
are taken from the server's streamed ``usage``.

Workloads (all texts are our own; the published measurements they reproduce are summarised in docs/load-generator.md):

============== ========== ============================================ =========== ============
name           endpoint   prompt                                       decoding    output
============== ========== ============================================ =========== ============
copy           completion a paragraph + a Python function (~300 tok),   greedy      256, ignore_eos
                          asked to be copied twice, with the first
                          copy already given ("Copy 1: … Copy 2:")
word-chain     completion 200 words drawn from a fixed list of 30       greedy      256, ignore_eos
random-output  completion 200 token ids uniform over the vocabulary      temp 1.0    256, ignore_eos
code-return    chat       rename ``budget`` to ``token_budget`` and    greedy      natural end
                          return the whole function, code block only
explain        chat       three short paragraphs: why one long prompt   greedy      natural end
                          slows other users of a shared LLM server
random-words   completion 200 words drawn from a 200-word list (a load  greedy      256, ignore_eos
                          test's random-word prompts)
sharegpt       completion first human turn of each ShareGPT conversation server      reference
                          (``--dataset-path``, ShareGPT_V3 format)      default     completion
============== ========== ============================================ =========== ============

Output length, ``ignore_eos`` and temperature are overridable (:class:`WorkloadOptions`).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from specwatch.common.files import NotARegularFile, read_regular_file

Endpoint = Literal["completions", "chat"]

#: SmolLM2's vocabulary size (the embedded model); ``--vocab-size`` overrides it.
DEFAULT_VOCAB_SIZE = 49152


class WorkloadError(ValueError):
    """A workload name, option or dataset file is invalid (message says which and why)."""


@dataclass(frozen=True)
class BenchRequest:
    """One request of a batch, frozen so the same object can be sent to several servers.

    ``endpoint`` selects ``/v1/completions`` (``prompt`` is a str, or a tuple of token ids) or
    ``/v1/chat/completions`` (``messages`` is a tuple of ``(role, content)`` pairs).
    ``max_tokens`` None means "until the model stops" (natural end); ``temperature`` None leaves
    the server's default. ``prompt_len`` is known only for token-id prompts (else None; the
    server's ``usage.prompt_tokens`` is used).
    """

    workload: str
    index: int
    endpoint: Endpoint
    prompt: str | tuple[int, ...] | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    ignore_eos: bool = False
    prompt_len: int | None = None

    def payload(self, model: str) -> dict[str, Any]:
        """The JSON body for the OpenAI-compatible endpoint (always streaming, with usage).

        Field names follow ``vllm bench serve`` (``max_tokens`` for completions,
        ``max_completion_tokens`` for chat, vLLM's ``ignore_eos`` extension).
        """
        body: dict[str, Any] = {
            "model": model,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.endpoint == "chat":
            body["messages"] = [{"role": r, "content": c} for r, c in (self.messages or ())]
            if self.max_tokens is not None:
                body["max_completion_tokens"] = self.max_tokens
        else:
            body["prompt"] = list(self.prompt) if isinstance(self.prompt, tuple) else self.prompt
            if self.max_tokens is not None:
                body["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body

    def excerpt(self, limit: int = 80) -> str:
        """One-line excerpt of the prompt (the last chat message; ``<N token ids>`` for token-id
        prompts), at most ``limit`` characters."""
        if self.endpoint == "chat":
            text = self.messages[-1][1] if self.messages else ""
        elif isinstance(self.prompt, tuple):
            return f"<{len(self.prompt)} token ids>"
        else:
            text = self.prompt or ""
        t = " ".join(text.split())
        return t if len(t) <= limit else t[: limit - 1] + "…"

    @property
    def path(self) -> str:
        """URL path under the server root: ``/v1/completions`` or ``/v1/chat/completions``."""
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"


@dataclass(frozen=True)
class WorkloadSpec:
    """Defaults of one workload as the published measurement ran it (None output length = natural end)."""

    name: str
    endpoint: Endpoint
    output_len: int | None
    ignore_eos: bool
    temperature: float | None
    description: str


WORKLOADS: dict[str, WorkloadSpec] = {
    s.name: s
    for s in (
        WorkloadSpec("copy", "completions", 256, True, 0.0, "copy a paragraph and a function verbatim"),
        WorkloadSpec("word-chain", "completions", 256, True, 0.0, "continue 200 words from a 30-word list"),
        WorkloadSpec("random-output", "completions", 256, True, 1.0, "200 random token ids, temperature 1.0"),
        WorkloadSpec("code-return", "chat", None, False, 0.0, "chat: rename a variable, return the function"),
        WorkloadSpec("explain", "chat", None, False, 0.0, "chat: three short paragraphs of explanation"),
        WorkloadSpec("random-words", "completions", 256, True, 0.0, "load test: 200 random words"),
        WorkloadSpec("sharegpt", "completions", None, False, None, "ShareGPT conversations (--dataset-path)"),
    )
}


@dataclass(frozen=True)
class WorkloadOptions:
    """Overrides and sampling inputs shared by all workloads of a run.

    ``output_len`` / ``ignore_eos`` / ``temperature``: None keeps each workload's default.
    ``seed``: run seed. ``vocab_size``: token ids of random-output are drawn from
    ``range(vocab_size)``. ``prompt_words``: words (or token ids) per generated prompt (200 in the
    seed). ``dataset_path``: a ShareGPT-format JSON file (required by ``sharegpt``).
    """

    output_len: int | None = None
    ignore_eos: bool | None = None
    temperature: float | None = None
    seed: int = 0
    vocab_size: int = DEFAULT_VOCAB_SIZE
    prompt_words: int = 200
    dataset_path: str | None = None

    def __post_init__(self) -> None:
        if self.output_len is not None and self.output_len < 1:
            raise WorkloadError(f"output length must be >= 1, got {self.output_len}")
        if self.vocab_size < 2:
            raise WorkloadError(f"vocabulary size must be >= 2, got {self.vocab_size}")
        if self.prompt_words < 1:
            raise WorkloadError(f"prompt length must be >= 1, got {self.prompt_words}")
        if self.temperature is not None and not (0.0 <= self.temperature <= 100.0):
            raise WorkloadError(f"temperature must be in [0, 100], got {self.temperature}")


# --------------------------------------------------------------------------------------------
# Our own texts.

COPY_TEXTS: tuple[tuple[str, str], ...] = (
    (
        "The lighthouse keeper on Marrow Point kept two logbooks. In the first he wrote the weather "
        "every four hours: wind direction, the height of the swell, and whether the fog bell had "
        "been rung. In the second, which nobody asked him to keep, he wrote down every ship that "
        "passed close enough to read its name. After thirty years the second book was the more "
        "useful one, because the harbour office had lost its own records in a flood and came to "
        "him whenever an insurer wanted to know which vessel had been where on a given night.",
        "def rolling_mean(values, window):\n"
        "    \"\"\"Return the mean of each run of `window` consecutive values.\"\"\"\n"
        "    if window <= 0:\n"
        "        raise ValueError(\"window must be positive\")\n"
        "    means = []\n"
        "    total = 0.0\n"
        "    for i, value in enumerate(values):\n"
        "        total += value\n"
        "        if i >= window:\n"
        "            total -= values[i - window]\n"
        "        if i >= window - 1:\n"
        "            means.append(total / window)\n"
        "    return means\n",
    ),
    (
        "A small bakery in the old market sells bread only until noon. The owner starts the ovens "
        "at three in the morning, shapes the loaves by hand, and writes the day's list on a slate "
        "by the door: rye, spelt, a white loaf with seeds, and on Fridays a sweet braid with "
        "raisins. When the slate is empty she closes the shutters, sweeps the floor, and spends "
        "the afternoon feeding the starter that has lived in the same clay jar for nineteen years. "
        "Regular customers know to come early, and newcomers learn quickly.",
        "def parse_duration(text):\n"
        "    \"\"\"Parse strings such as '1h30m' or '45s' into a number of seconds.\"\"\"\n"
        "    units = {\"h\": 3600, \"m\": 60, \"s\": 1}\n"
        "    seconds = 0\n"
        "    number = \"\"\n"
        "    for char in text.strip():\n"
        "        if char.isdigit():\n"
        "            number += char\n"
        "        elif char in units and number:\n"
        "            seconds += int(number) * units[char]\n"
        "            number = \"\"\n"
        "        else:\n"
        "            raise ValueError(f\"bad duration: {text!r}\")\n"
        "    if number:\n"
        "        raise ValueError(f\"missing unit in {text!r}\")\n"
        "    return seconds\n",
    ),
    (
        "Every spring the river below the village floods the lower meadow for about two weeks. The "
        "farmers long ago stopped fighting it. Instead they moved the barns uphill, planted willows "
        "along the bank to slow the current, and now graze their sheep on the meadow only after "
        "the water has gone down and left a layer of silt behind. The grass that grows there in "
        "early summer is the greenest in the valley, and visitors who photograph it rarely guess "
        "that a month earlier the whole field was a shallow brown lake.",
        "def merge_intervals(intervals):\n"
        "    \"\"\"Merge overlapping (start, end) pairs and return them sorted.\"\"\"\n"
        "    merged = []\n"
        "    for start, end in sorted(intervals):\n"
        "        if merged and start <= merged[-1][1]:\n"
        "            last_start, last_end = merged[-1]\n"
        "            merged[-1] = (last_start, max(last_end, end))\n"
        "        else:\n"
        "            merged.append((start, end))\n"
        "    return merged\n",
    ),
    (
        "The night train from the coast to the capital stops at eleven stations, but most "
        "passengers sleep through all of them. The conductor walks the corridor once an hour with a "
        "small lamp, checking that doors are latched and that nobody has left a bag in the "
        "gangway. At the mountain pass the train slows to walking pace, and if you are awake you "
        "can see the lights of the border post and hear the engine change its tone as it pulls "
        "the long line of carriages up the last steep mile before the tunnel.",
        "def chunk_text(text, size, overlap=0):\n"
        "    \"\"\"Split text into pieces of `size` characters sharing `overlap` characters.\"\"\"\n"
        "    if size <= overlap:\n"
        "        raise ValueError(\"size must be larger than overlap\")\n"
        "    pieces = []\n"
        "    start = 0\n"
        "    while start < len(text):\n"
        "        pieces.append(text[start:start + size])\n"
        "        start += size - overlap\n"
        "    return pieces\n",
    ),
    (
        "Our team keeps a shared notebook of every production incident. Each entry has the same "
        "four headings: what users saw, what we first believed, what was actually wrong, and what "
        "we changed afterwards. The third heading is the one people read most, because the first "
        "belief is so often mistaken. Last year a slow checkout page was blamed on the database for "
        "two days before someone noticed that a logging call was writing the whole shopping basket "
        "to disk on every click, and the notebook now has a page about that.",
        "def retry(func, attempts=3, delay=0.5):\n"
        "    \"\"\"Call func until it succeeds, sleeping `delay` seconds between attempts.\"\"\"\n"
        "    import time\n"
        "    last_error = None\n"
        "    for attempt in range(attempts):\n"
        "        try:\n"
        "            return func()\n"
        "        except Exception as error:\n"
        "            last_error = error\n"
        "            if attempt + 1 < attempts:\n"
        "                time.sleep(delay * (2 ** attempt))\n"
        "    raise RuntimeError(\"all attempts failed\") from last_error\n",
    ),
    (
        "In the observatory on the hill the telescope is older than the building around it. It was "
        "carried up the slope in pieces on the backs of mules, reassembled by a clockmaker from the "
        "town, and has been cleaned and oiled every autumn since. Students who visit are allowed to "
        "look at the moon and at Saturn, and the guide always waits for the moment when someone "
        "sees the rings for the first time and says nothing at all, because that silence is the "
        "reason the guide still climbs the hill on cold evenings.",
        "def word_counts(lines):\n"
        "    \"\"\"Count words across lines, ignoring case and surrounding punctuation.\"\"\"\n"
        "    counts = {}\n"
        "    for line in lines:\n"
        "        for word in line.split():\n"
        "            word = word.strip(\".,;:!?\\\"'()\").lower()\n"
        "            if word:\n"
        "                counts[word] = counts.get(word, 0) + 1\n"
        "    return dict(sorted(counts.items(), key=lambda item: -item[1]))\n",
    ),
)

#: The fixed 30-word list of word-chain.
WORD_CHAIN_WORDS: tuple[str, ...] = (
    "signal", "river", "meadow", "lantern", "copper", "harbor", "pepper", "window", "orbit", "marble",
    "canyon", "violet", "thunder", "basket", "falcon", "garden", "ribbon", "silver", "tunnel", "quiet",
    "anchor", "cobalt", "ember", "frost", "glacier", "hollow", "island", "jasmine", "kettle", "ladder",
)

#: The 200-word list of random-words (load-test prompts).
RANDOM_WORDS: tuple[str, ...] = tuple(
    """able acid aged also area army away baby back ball band bank base bath bear beat been beer bell
    belt best bird blow blue boat body bone book boot born boss both bowl burn bush busy cake call calm
    came camp card care cart case cash cast cell chat chip city club coal coat code cold come cook cool
    cope copy core cost crew crop dark data date dawn dead deal dear debt deep deny desk diet dirt dish
    door down draw drew drop drug dual duke dust duty each earn ease east easy edge else even ever evil
    exit face fact fail fair fall farm fast fate fear feed feel fell felt file fill film find fine fire
    firm fish five flat flow food foot ford form fort four free from fuel full fund gain game gate gave
    gear gene gift girl give glad goal goes gold golf gone good gray grew grey grow gulf hair half hall
    hand hang hard harm hate have head hear heat held hell help here hero high hill hire hold hole holy
    home hope host hour huge hung hunt hurt idea inch into iron item jack jane jean john join jump jury
    just keen keep kent kept kick kill kind king knee knew know lack lady laid lake land lane last late""".split()  # noqa: SIM905  one block of words, not 200 literals
)[:200]

CODE_RETURN_FUNCTIONS: tuple[str, ...] = (
    "def plan_batches(requests, budget):\n"
    "    batches = []\n"
    "    current = []\n"
    "    used = 0\n"
    "    for request in requests:\n"
    "        cost = request.prompt_tokens + request.max_tokens\n"
    "        if cost > budget:\n"
    "            raise ValueError(f\"request {request.id} needs {cost} tokens, budget is {budget}\")\n"
    "        if used + cost > budget:\n"
    "            batches.append(current)\n"
    "            current = []\n"
    "            used = 0\n"
    "        current.append(request)\n"
    "        used += cost\n"
    "    if current:\n"
    "        batches.append(current)\n"
    "    return batches\n",
    "def trim_history(messages, budget, count_tokens):\n"
    "    kept = []\n"
    "    remaining = budget\n"
    "    for message in reversed(messages):\n"
    "        size = count_tokens(message[\"content\"])\n"
    "        if size > remaining:\n"
    "            break\n"
    "        kept.append(message)\n"
    "        remaining -= size\n"
    "    kept.reverse()\n"
    "    print(f\"kept {len(kept)} messages, {budget - remaining} of {budget} tokens\")\n"
    "    return kept\n",
    "class Summarizer:\n"
    "    def __init__(self, client, budget=2048):\n"
    "        self.client = client\n"
    "        self.budget = budget\n"
    "\n"
    "    def summarize(self, text):\n"
    "        words = text.split()\n"
    "        limit = self.budget // 2\n"
    "        if len(words) > limit:\n"
    "            words = words[:limit]\n"
    "        prompt = \"Summarize:\\n\" + \" \".join(words)\n"
    "        return self.client.complete(prompt, max_tokens=self.budget - limit)\n",
)

EXPLAIN_PROMPT = (
    "In three short paragraphs, explain why one very long prompt sent to a shared large language "
    "model server can make responses slower for the other users of that server."
)


def copy_prompt(i: int) -> str:
    """Copy prompt number ``i % 6``: the text, then "Copy 1:" with the text, then "Copy 2:"."""
    paragraph, code = COPY_TEXTS[i % len(COPY_TEXTS)]
    text = f"{paragraph}\n\n{code}"
    return (
        "Copy the following text exactly, character for character, two times.\n\n"
        f"Text:\n{text}\nCopy 1:\n{text}\nCopy 2:\n"
    )


def word_chain_prompt(rng: random.Random, n_words: int) -> str:
    """``n_words`` words drawn with replacement from :data:`WORD_CHAIN_WORDS`, to be continued."""
    words = " ".join(rng.choice(WORD_CHAIN_WORDS) for _ in range(n_words))
    return f"Continue this list of words in the same style:\n{words}"


def random_words_prompt(rng: random.Random, n_words: int) -> str:
    """``n_words`` words drawn with replacement from :data:`RANDOM_WORDS` (a load-test prompt)."""
    return " ".join(rng.choice(RANDOM_WORDS) for _ in range(n_words))


def code_return_messages(i: int) -> tuple[tuple[str, str], ...]:
    """The code-return chat turn for function number ``i % 3``."""
    fn = CODE_RETURN_FUNCTIONS[i % len(CODE_RETURN_FUNCTIONS)]
    return (
        (
            "user",
            "In this Python function, rename the variable `budget` to `token_budget` and return the "
            "whole function. Reply with the code block only.\n\n```python\n" + fn + "```",
        ),
    )


# --------------------------------------------------------------------------------------------
# ShareGPT files.


@dataclass(frozen=True)
class ShareGPTItem:
    """One usable conversation: first human turn and the reply that followed it."""

    prompt: str
    completion: str

    @property
    def estimated_output_len(self) -> int:
        """Output length in tokens estimated from the reply without a tokenizer: ``ceil(chars/4)``,
        clamped to 4…2048 (``vllm bench serve`` tokenizes the reply instead)."""
        return max(4, min(2048, math.ceil(len(self.completion) / 4)))


#: The largest ShareGPT file read (bytes): the published ShareGPT_V3 file is about 650 MB.
SHAREGPT_MAX_BYTES = 2 << 30


def load_sharegpt(path: str | Path) -> list[ShareGPTItem]:
    """Read a ShareGPT-format file (``ShareGPT_V3_unfiltered_cleaned_split.json``: a JSON list of
    ``{"id": …, "conversations": [{"from": "human"|"gpt", "value": str}, …]}``).

    Conversations with fewer than two turns, or whose first two turns are not human → gpt with
    non-empty text, are skipped (as vLLM's ShareGPT loader does). Raises :class:`WorkloadError`
    when the file is missing, not a regular file (a FIFO, a device: refused before reading) or
    larger than :data:`SHAREGPT_MAX_BYTES`, not JSON, not a list, or holds no usable conversation.
    """
    p = Path(path)
    try:
        data = json.loads(read_regular_file(p, SHAREGPT_MAX_BYTES, "ShareGPT file").decode("utf-8"))
    except FileNotFoundError:
        raise WorkloadError(f"ShareGPT file not found: {p}") from None
    except NotARegularFile as exc:  # a FIFO would block, /dev/zero would fill the memory
        raise WorkloadError(str(exc)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkloadError(f"cannot read ShareGPT file {p}: {exc}") from exc
    if not isinstance(data, list):
        raise WorkloadError(f"ShareGPT file {p} must hold a JSON list of conversations")
    items: list[ShareGPTItem] = []
    for entry in data:
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(conv, list) or len(conv) < 2:
            continue
        first, second = conv[0], conv[1]
        if not (isinstance(first, dict) and isinstance(second, dict)):
            continue
        if first.get("from") != "human" or second.get("from") != "gpt":
            continue
        prompt, completion = first.get("value"), second.get("value")
        if isinstance(prompt, str) and isinstance(completion, str) and prompt.strip() and completion.strip():
            items.append(ShareGPTItem(prompt, completion))
    if not items:
        raise WorkloadError(f"ShareGPT file {p} holds no usable human→gpt conversation")
    return items


def sample_sharegpt_path() -> Path:
    """Path of the small ShareGPT-format sample shipped with specwatch (our own texts)."""
    return Path(__file__).resolve().parent.parent / "data" / "sharegpt_sample.json"


# --------------------------------------------------------------------------------------------


def _rng(seed: int, workload: str, batch: int) -> random.Random:
    # A str seed is hashed with SHA-512 by random.seed (version 2): stable across processes.
    return random.Random(f"specwatch-bench:{seed}:{workload}:{batch}")


def parse_workloads(text: str) -> tuple[str, ...]:
    """Parse a comma-separated workload list (``"copy,explain"``); raises :class:`WorkloadError`
    naming unknown workloads and the valid ones."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise WorkloadError("no workload given")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise WorkloadError(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    return names


def build_requests(
    workload: str,
    num_prompts: int,
    options: WorkloadOptions,
    batch: int = 0,
    *,
    sharegpt_items: list[ShareGPTItem] | None = None,
) -> list[BenchRequest]:
    """The ``num_prompts`` requests of batch ``batch`` of ``workload``.

    Deterministic in (options.seed, workload, batch): servers compared in one run receive the same
    list. ``sharegpt_items`` may be passed pre-loaded (else ``options.dataset_path`` is read).
    Raises :class:`WorkloadError` for an unknown workload, ``num_prompts < 1``, or ``sharegpt``
    without a usable dataset file.
    """
    spec = WORKLOADS.get(workload)
    if spec is None:
        raise WorkloadError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    if num_prompts < 1:
        raise WorkloadError(f"num_prompts must be >= 1, got {num_prompts}")
    rng = _rng(options.seed, workload, batch)
    ignore_eos = spec.ignore_eos if options.ignore_eos is None else options.ignore_eos
    temperature = spec.temperature if options.temperature is None else options.temperature
    max_tokens = spec.output_len if options.output_len is None else options.output_len
    n = options.prompt_words

    if workload == "sharegpt":
        items = sharegpt_items
        if items is None:
            if not options.dataset_path:
                raise WorkloadError("the sharegpt workload needs --dataset-path (a ShareGPT-format JSON file)")
            items = load_sharegpt(options.dataset_path)
        order = list(range(len(items)))
        rng.shuffle(order)
        out = []
        for i in range(num_prompts):
            item = items[order[i % len(order)]]
            out.append(
                BenchRequest(
                    workload, i, "completions", prompt=item.prompt,
                    max_tokens=max_tokens if max_tokens is not None else item.estimated_output_len,
                    temperature=temperature, ignore_eos=ignore_eos,
                )
            )
        return out

    out = []
    for i in range(num_prompts):
        common: dict[str, Any] = dict(max_tokens=max_tokens, temperature=temperature, ignore_eos=ignore_eos)
        if workload == "copy":
            # Rotate through the six texts, starting at a seeded offset per batch.
            out.append(BenchRequest(workload, i, "completions", prompt=copy_prompt(i + batch), **common))
        elif workload == "word-chain":
            out.append(BenchRequest(workload, i, "completions", prompt=word_chain_prompt(rng, n), **common))
        elif workload == "random-output":
            ids = tuple(rng.randrange(options.vocab_size) for _ in range(n))
            out.append(BenchRequest(workload, i, "completions", prompt=ids, prompt_len=n, **common))
        elif workload == "random-words":
            out.append(BenchRequest(workload, i, "completions", prompt=random_words_prompt(rng, n), **common))
        elif workload == "code-return":
            out.append(BenchRequest(workload, i, "chat", messages=code_return_messages(i + batch), **common))
        elif workload == "explain":
            out.append(BenchRequest(workload, i, "chat", messages=(("user", EXPLAIN_PROMPT),), **common))
        else:  # pragma: no cover - WORKLOADS and this chain are kept in step by tests
            raise WorkloadError(f"workload {workload!r} has no builder")
    return out


def equivalence_requests(output_len: int = 128, count_per_kind: int = 6, seed: int = 0) -> list[BenchRequest]:
    """The greedy-output equivalence prompts: ``count_per_kind`` copy prompts and as many
    word-chain prompts (6 + 6 in the published n-gram measurement), greedy, ``output_len`` tokens with ``ignore_eos``."""
    opts = WorkloadOptions(output_len=output_len, ignore_eos=True, temperature=0.0, seed=seed)
    reqs = build_requests("copy", count_per_kind, opts, batch=0)
    reqs += [
        BenchRequest("word-chain", count_per_kind + r.index, r.endpoint, prompt=r.prompt,
                     max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True)
        for r in build_requests("word-chain", count_per_kind, opts, batch=0)
    ]
    return reqs
