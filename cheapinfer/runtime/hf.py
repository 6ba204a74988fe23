"""The one place that speaks to transformers' moving API.

transformers renamed and reshaped the parts of its API this suite stands on between 4.x and 5.x.
Everything that depends on which release is installed lives here, so that a library update is
fixed in one place and every measured loop speaks to the model the same way:

- **the cache keyword and output field.** A forward takes its KV cache as ``cache`` (5.x) or
  ``past_key_values`` (4.x; deprecated in 5.x) and returns it under the same name. A forward
  that is handed the cache under a name it does not know takes it into ``**kwargs`` and drops it
  silently: the step then runs without its history. :func:`forward` and :func:`generate` hand it
  over under the installed name; :func:`output_cache` reads it back without tripping a
  deprecation. No other module passes a cache keyword to a model (a self-test reads the source).
- **the Cache subclass API.** A cache layer reports its maximum length as ``get_max_length``
  (5.x) or ``get_max_cache_shape`` (4.x), and ``get_mask_sizes`` takes the query length (5.x) or
  the ``cache_position`` tensor (4.x). :func:`cache_bases` gives a layer base class that answers
  both from :meth:`Layer.max_length` and :meth:`Layer.mask_sizes`.
- **tokenizer conventions.** Whether a tokenizer prepends BOS, and which tokens are EOS and
  padding, is decided by the conversion, which differs between releases: :func:`pin_tokenizer`
  sets them from the artifact's own metadata and :func:`tokenizer_conventions` reads them back,
  so a model's tokens do not depend on the installed release.
- **construction from a config** (:func:`from_config`, :func:`meta_model` on the meta device: shapes
  and ops without memory or arithmetic). 4.x computes RoPE's angles as a matrix product under
  ``torch.autocast(device_type=...)``, which has no meta device and which a flop counter counts;
  there the rotary embedding gets 5.x's equivalent, elementwise forward (the same numbers).
- **what a forward saw** (:class:`ForwardTrace`): the tokens fed and the cache handed in and
  back, read from outside the code under test with forward hooks, under either keyword.
"""

from __future__ import annotations

import inspect
import threading
from functools import lru_cache
from typing import Any, Mapping

import torch

#: The names a forward may take its KV cache under, the current one first.
CACHE_NAMES = ("cache", "past_key_values")


def major_version() -> int:
    """The installed transformers' major version."""
    import transformers

    return int(transformers.__version__.split(".")[0])


@lru_cache(maxsize=None)
def _keyword_of(forward_type: type, name: str) -> str:
    return "cache" if "cache" in _parameters(forward_type, name) else "past_key_values"


@lru_cache(maxsize=None)
def _parameters(owner: type, name: str) -> frozenset[str]:
    return frozenset(inspect.signature(getattr(owner, name)).parameters)


def cache_keyword(model, method: str = "forward") -> str:
    """The keyword under which ``model.<method>`` takes its cache on the installed transformers.

    Read from the signature: ``cache`` where the method names it (5.x), else ``past_key_values``
    (4.x, where ``generate`` takes it through ``**kwargs``)."""
    if method == "generate":  # generate takes model kwargs through **kwargs on 4.x: decide by the forward
        method = "forward"
    return _keyword_of(type(model), method)


def forward(model, input_ids: torch.Tensor | None = None, *, cache=None, **kwargs: Any):
    """``model(input_ids=..., **kwargs)`` with ``cache`` handed over under the installed name.

    ``cache=None`` hands over no cache: the model makes a fresh one (``use_cache=True``) or none.
    """
    if cache is not None:
        kwargs[cache_keyword(model)] = cache
    return model(input_ids=input_ids, **kwargs)


def generate(model, input_ids: torch.Tensor, *, cache=None, **kwargs: Any) -> torch.Tensor:
    """``model.generate(input_ids, **kwargs)`` with ``cache`` handed over under the installed name."""
    if cache is not None:
        kwargs[cache_keyword(model, "generate")] = cache
    return model.generate(input_ids, **kwargs)


def model_ids(model, ids) -> torch.Tensor:
    """Token ids (a tensor, or a list of ids or of rows of ids) as a long tensor on ``model``'s device, where its
    embedding reads them: ids made on the CPU for a model on a GPU fail at its first layer (issue 41)."""
    return torch.as_tensor(ids, dtype=torch.long).to(next(model.parameters()).device)


def output_cache(out):
    """The cache a forward returned, or None, read without tripping the old name's deprecation."""
    fields = getattr(out, "__dataclass_fields__", {})
    for name in CACHE_NAMES:
        if name in fields:
            return getattr(out, name)
    return None


def call_cache(args: tuple, kwargs: Mapping[str, Any]):
    """The cache a forward call was handed (by keyword, under either name), or None."""
    return next((kwargs[k] for k in CACHE_NAMES if kwargs.get(k) is not None), None)


def new_cache(config):
    """An empty ``DynamicCache`` for a model of ``config``."""
    from transformers import DynamicCache

    return DynamicCache(config=config)


def cache_length(cache) -> int:
    """Tokens a cache holds (0 for no cache)."""
    return 0 if cache is None else int(cache.get_seq_length())


def crop(cache, length: int) -> None:
    """Keep the first ``length`` positions of ``cache`` (``Cache.crop`` takes minus the number to remove)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


# ------------------------------------------------------------------------------------------------
# the Cache subclass API
# ------------------------------------------------------------------------------------------------


def cache_bases() -> tuple[type, type]:
    """(``Cache``, a layer base class) of the installed transformers.

    Subclasses of the layer base implement :meth:`max_length` and :meth:`mask_sizes`; the base
    answers the installed release's spelling of both (``get_max_length`` / ``get_max_cache_shape``;
    ``get_mask_sizes`` given a query length or a ``cache_position`` tensor).
    """
    return _bases()


@lru_cache(maxsize=1)
def _bases() -> tuple[type, type]:
    from transformers.cache_utils import Cache, CacheLayerMixin

    class Layer(CacheLayerMixin):
        """A cache layer that answers the 4.x and the 5.x spelling of the layer API."""

        def max_length(self) -> int:
            return -1

        def mask_sizes(self, query_length: int) -> tuple[int, int]:
            raise NotImplementedError

        def get_max_length(self) -> int:  # 5.x
            return self.max_length()

        def get_max_cache_shape(self) -> int:  # 4.x
            return self.max_length()

        def get_mask_sizes(self, query, *args) -> tuple[int, int]:  # 5.x: the query length; 4.x: cache_position [T]
            return self.mask_sizes(int(query.shape[-1]) if torch.is_tensor(query) else int(query))

    return Cache, Layer


# ------------------------------------------------------------------------------------------------
# tokenizer conventions
# ------------------------------------------------------------------------------------------------


def eos_ids(model) -> set[int]:
    """The end-of-sequence ids of the model's generation config (one id or a list of them; none where it sets none)."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}


def tokenizer_conventions(tokenizer) -> dict[str, Any]:
    """What a tokenizer does around the text: does it prepend BOS, append EOS, and which ids are BOS, EOS, padding."""
    probe = tokenizer("a", add_special_tokens=True)["input_ids"]
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    return {
        "adds_bos": len(probe) > len(bare) and probe[0] == tokenizer.bos_token_id,
        "adds_eos": len(probe) > len(bare) and probe[-1] == tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def pin_tokenizer(tokenizer, *, add_bos: bool, bos_id: int | None, eos_id: int | None, pad_id: int | None):
    """Set the tokenizer's conventions to the given ones (the artifact's metadata), whatever the release's
    conversion chose; ValueError if it does not follow them afterwards."""
    def token(i: int | None):
        return None if i is None else tokenizer.convert_ids_to_tokens(int(i))

    for attribute, value in (("bos_token", token(bos_id)), ("eos_token", token(eos_id)), ("pad_token", token(pad_id))):
        if value is not None:
            setattr(tokenizer, attribute, value)
    if hasattr(tokenizer, "add_bos_token"):
        tokenizer.add_bos_token = add_bos  # 4.x fast Llama tokenizers rebuild their post-processor on this
    if hasattr(tokenizer, "add_eos_token"):
        tokenizer.add_eos_token = False
    want = {"adds_bos": add_bos, "adds_eos": False, "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id}
    got = tokenizer_conventions(tokenizer)
    if got != want:
        raise ValueError(f"the tokenizer does not follow the pinned conventions: {got}, not {want}")
    return tokenizer


# ------------------------------------------------------------------------------------------------
# models
# ------------------------------------------------------------------------------------------------


def from_config(config, dtype: torch.dtype = torch.float32):
    """A causal LM of ``config`` with transformers' own initialisation (seed first), in eval mode.

    On 4.x its rotary embedding computes its angles as 5.x does (:func:`_release_independent_rotary`)."""
    from transformers import AutoModelForCausalLM

    return _release_independent_rotary(AutoModelForCausalLM.from_config(config, dtype=dtype).eval().requires_grad_(False))


def cast_copy(model, dtype: torch.dtype):
    """``copy.deepcopy(model).to(dtype=dtype)`` without the full-precision copy in between: every parameter and buffer
    of the copy is new storage (floating-point ones cast to ``dtype``, the rest cloned; a tied weight stays tied), the
    rest of the modules is deep-copied, and ``model`` is not changed. The same tensors, bit for bit, for at most the
    copy's bytes at once: a deep copy first holds a second full-precision model (2 GB for the twin in fp32)."""
    import copy

    originals = {id(t): t for t in (*model.parameters(), *model.buffers())}
    clone = copy.deepcopy(model, dict(originals))  # the modules copied, the tensors shared for now
    made: dict[int, torch.Tensor] = {}
    for module in clone.modules():
        for store in (module._parameters, module._buffers):
            for name, t in store.items():
                if t is None or id(t) not in originals:
                    continue
                if id(t) not in made:
                    new = t.detach().to(dtype, copy=True) if t.is_floating_point() else t.detach().clone()
                    made[id(t)] = torch.nn.Parameter(new, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else new
                store[name] = made[id(t)]
    return clone


def meta_model(config, dtype: torch.dtype = torch.float32):
    """A transformers causal LM on the meta device: real shapes and ops, no memory, no arithmetic."""
    with torch.device("meta"):
        return from_config(config, dtype)


def _release_independent_rotary(model):
    """On 4.x, give every default rotary embedding the forward 5.x has: the same numbers, computed another way.

    4.x builds RoPE's angles as a matrix product ``[D/2, 1] x [1, T]`` under ``torch.autocast(device_type=...)``:
    autocast has no meta device, and a flop counter counts the product (an outer product: one multiplication
    per angle, the same numbers as 5.x's elementwise product, no accumulation). 5.x multiplies elementwise."""
    if major_version() >= 5:
        return model
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding") and getattr(module, "rope_type", "default") == "default":
            module.forward = _autocast_free_rotary(module)
    return model


def _autocast_free_rotary(module):
    """The rotary embedding's forward as 5.x writes it (fp32, no autocast): the same numbers, and it runs on meta."""

    def forward(x: torch.Tensor, position_ids: torch.Tensor):
        freqs = position_ids[..., None].float() * module.inv_freq.to(device=x.device, dtype=torch.float)  # [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [B, T, D]
        return (emb.cos() * module.attention_scaling).to(x.dtype), (emb.sin() * module.attention_scaling).to(x.dtype)

    return forward


# ------------------------------------------------------------------------------------------------
# what a forward saw
# ------------------------------------------------------------------------------------------------


class ForwardTrace:
    """Records every forward of ``model`` inside the block, from outside the code under test.

    Each record holds ``tokens_in`` (positions fed), ``handed_cache`` (whether a cache object was
    handed in, under either name), ``cache_in`` (tokens it held; 0 when none was handed in),
    ``cache_out`` (tokens the returned cache holds), ``label`` (what :attr:`label` was when the
    forward began: a loop that interleaves several, such as two scheduling policies, names the one
    running) and, for the first ``keep_logits`` forwards of each label that were handed a non-empty
    cache, the last position's logits (fp32, on the CPU, ``[B, V]``) and the ids fed (``[B, T]``).
    ``fresh_rows``: the rows of a forward handed a non-empty cache that are fed one token at position 0
    (``position_ids``; a request admitted into a batch that holds other requests' histories); the
    logits and ids of the first ``keep_logits`` such forwards of each label are kept too (and no more are
    looked for after them).
    Only the forwards of the thread that opened the trace are recorded: a model shared with other
    threads (a target that several drafts' loops run on at once) is traced once per loop.
    """

    def __init__(self, model, keep_logits: int = 4):
        self.model = model
        self.keep_logits = keep_logits
        self.label = ""
        self.forwards: list[dict] = []
        self._local = threading.local()
        self._lock = threading.Lock()
        self._handles: list = []
        self._kept: dict[str, int] = {}
        self._owner = threading.get_ident()

    def _pre(self, module, args, kwargs):
        # A deep copy of the model (a draft built meanwhile) carries the hook too; another thread's forwards are its own.
        if module is not self.model or threading.get_ident() != self._owner:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        handed = call_cache(args, kwargs)
        rec = {"tokens_in": int(ids.shape[-1]), "handed_cache": handed is not None, "cache_in": cache_length(handed), "label": self.label}
        if rec["cache_in"] > 0:
            positions = kwargs.get("position_ids")
            # Looked for only until enough are kept: reading the positions waits for the device, inside a timed step.
            if positions is not None and rec["tokens_in"] == 1 and self._kept.get((self.label, "fresh"), 0) < self.keep_logits:
                rec["fresh_rows"] = [int(i) for i in torch.nonzero(positions[:, 0] == 0).flatten()]
            with self._lock:
                # The first forwards of each label, and the first that admit a request beside other histories.
                kind = (self.label, "fresh") if rec.get("fresh_rows") else self.label
                keep = self._kept.get(kind, 0) < self.keep_logits
                if keep:
                    self._kept[kind] = self._kept.get(kind, 0) + 1
            if keep:
                rec["ids"] = ids.detach().clone()
        self._local.pending = rec

    def _post(self, module, args, kwargs, out):
        rec = getattr(self._local, "pending", None)
        if module is not self.model or rec is None:  # a forward that began before the trace did
            return
        self._local.pending = None
        rec["cache_out"] = cache_length(output_cache(out))
        if "ids" in rec:
            rec["logits"] = out.logits[:, -1].detach().float().cpu()
        with self._lock:
            self.forwards.append(rec)

    def labelled(self, label: str) -> list[dict]:
        return [r for r in self.forwards if r["label"] == label]

    def __enter__(self) -> "ForwardTrace":
        # Plain functions, not bound methods: deep-copying the model (a quantized draft made from it while it is
        # traced) copies its hooks by reference instead of copying this trace.
        def pre(module, args, kwargs):
            return self._pre(module, args, kwargs)

        def post(module, args, kwargs, out):
            return self._post(module, args, kwargs, out)

        self._owner = threading.get_ident()
        self._handles = [self.model.register_forward_pre_hook(pre, with_kwargs=True),
                         self.model.register_forward_hook(post, with_kwargs=True)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
