"""Rounding: how far two numeric paths that compute the same thing may differ, derived from the formats.

Every comparison of two numeric paths in the suite (a kernel against the suite's fake quantization,
a paged cache against the model's own, a cached step against recomputation) takes its tolerance from
here, never from one machine's result:

- :func:`unit_roundoff`: u of a format, ``finfo(dtype).eps / 2`` under round-to-nearest
  (fp64 2^-53, fp32 2^-24, fp16 2^-11, bf16 2^-8).
- :func:`gamma` and :func:`dot_bound`: the standard a-priori bound for a dot product of length n
  accumulated in precision u, in any order and any blocking (Higham, *Accuracy and Stability of
  Numerical Algorithms*, 2nd ed., eq. 3.5): ``|fl(x.w) - x.w| <= gamma_n sum |x_i w_i|`` with
  ``gamma_n = n u / (1 - n u)``. Each further rounding of an input or the result to a stored
  format adds its u (one more term of gamma).
- :func:`first_order_bound`: the same for a whole transformer. A model evaluated in precision u
  computes, at every operation, the exact result moved by that operation's roundings, each
  bounded a priori (the list is in :class:`_Sites`). Run the model in float64 (its rounding is
  2^29 times smaller than fp32's); one backward pass gives df/dy at every operation, and the
  first-order change of a scalar ``f`` of the logits under all the roundings at once is
  ``sum <df/dy, rounding>``. Its worst case (every rounding at its bound, all of one sign) is
  rigorous but useless end to end: ~1e6 times the real difference of two fp32 evaluations of the
  stand-in. Roundings are not aligned: under the standard model of probabilistic rounding error
  analysis (independent, mean-zero roundings; Higham and Mary 2019) Hoeffding's inequality bounds
  the sum by ``LAMBDA sqrt(sum (df/dy c)^2)`` over every rounding's bound c, except with
  probability 2 exp(-LAMBDA^2 / 2) = 1.3e-9. That ``probable`` bound holds for *every* evaluation
  in precision u, whatever its kernels, summation order or batch shape, up to second-order terms
  (the roundings are ~1e-4 relative in fp32, so those are ~1e-4 of the bound); on the stand-in it
  is ~1e3 times the real difference of two fp32 paths, and twenty times and more below the
  perplexity and logit gaps of a real fault.
- :func:`compare_greedy`: two greedy continuations of one prompt that should be equal. Where they
  first differ, the two tokens' logit gap in float64 (teacher-forced on the common prefix) must lie
  within the first-order bound of that gap: only then can the two paths' rounding have chosen
  differently (a near-tie, reported); anything else is a real difference.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

F64 = torch.float64


def unit_roundoff(dtype: torch.dtype) -> float:
    """u of a floating-point format under round-to-nearest: half its machine epsilon. Integer formats are exact: 0."""
    if not dtype.is_floating_point:
        return 0.0
    return torch.finfo(dtype).eps / 2


def gamma(n: int, u: float) -> float:
    """gamma_n = n u / (1 - n u): the relative bound of n successive roundings at unit roundoff u (n u < 1)."""
    if n * u >= 1:
        raise ValueError(f"gamma_{n} at u = {u:g} is not defined (n u = {n * u:g} >= 1): {n} roundings at this precision bound nothing")
    return n * u / (1 - n * u)


def dot_bound(x: torch.Tensor, w: torch.Tensor, u: float, roundings: int = 0, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Elementwise a-priori bound of ``|fl(x @ w.T + bias) - (x @ w.T + bias)|`` in float64, ``[..., out]``.

    ``x`` [..., n], ``w`` [out, n]: gamma_{n + roundings (+ 1 with a bias)} (|x| @ |w|.T + |bias|).
    ``roundings``: further roundings of the result (a scale multiplied in, a cast to a stored format
    at the same u). Holds for every summation order and blocking, with the inputs as given.
    """
    n = x.shape[-1] + roundings + (bias is not None)
    mag = x.to(F64).abs() @ w.to(F64).abs().T
    if bias is not None:
        mag = mag + bias.to(F64).abs()
    return gamma(n, u) * mag


# ------------------------------------------------------------------------------------------------
# first-order error bound of a transformer's outputs
# ------------------------------------------------------------------------------------------------

#: Confidence of the probabilistic bounds: a bound fails with probability at most ``2 exp(-LAMBDA^2 / 2)``
#: (Hoeffding) under the model of independent, mean-zero roundings: 6.5 gives 1.3e-9.
LAMBDA = 6.5


@dataclass
class Precision:
    """The arithmetic of one evaluation of a model: ``u`` of the stored activations and the unit
    roundoff ``acc`` of the sums inside matrix products, norms and softmax (fp32 for fp32 models;
    fp32 is also what CPU and CUDA kernels sum 16-bit inputs in, which a 16-bit bound then
    assumes). ``product_roundings``: further roundings of every projection's result (1 for a
    kernel that multiplies a per-row scale into its sum)."""

    u: float
    acc: float
    product_roundings: int = 0

    @classmethod
    def of(cls, dtype: torch.dtype, product_roundings: int = 0) -> "Precision":
        u = unit_roundoff(dtype)
        return cls(u, min(u, unit_roundoff(torch.float32)), product_roundings)


@dataclass
class Bound:
    """First-order bounds of ``|f(any evaluation in a precision) - f(exact)|`` for a scalar f of a model's logits.

    ``worst``: the a-priori bound, every rounding at its largest and all aligned with df/dy.
    ``probable``: LAMBDA sqrt(sum (df/dy c)^2) over every rounding c: Hoeffding's bound on a sum of
    independent, mean-zero terms (the standard model of probabilistic rounding error analysis,
    Higham and Mary, SIAM J. Sci. Comput. 41, 2019), exceeded with probability <= 2 exp(-LAMBDA^2 / 2).
    ``parts``: ``probable`` by kind of operation, for the report.
    """

    value: float
    worst: float
    probable: float
    parts: dict[str, float]


class _Sites:
    """Forward hooks on a float64 Llama/Qwen2-style decoder that hook, after every operation, its
    output's gradient (df/dy there) and weigh with it the operation's rounding: ``b``, the
    a-priori bound of its error, and ``v``, the sum of the squared bounds of the single roundings
    that make it up (the variance proxy of ``Bound.probable``). u: stored activations, a: sums;
    all with the exact inputs of the float64 forward.

    - every ``nn.Linear`` (projections, LM head), ``y = x W^T + c`` with n inputs and
      m = |x||W|^T + |c|: n products, n - 1 sums, the bias sum and r extra roundings of a kernel,
      each at most a m (1 + gamma): b = gamma_{n+1+r}(a) m, v = (2n + 1 + r)(a m (1 + gamma))^2;
      plus u |y| when y is stored coarser than it was summed.
    - every RMSNorm (``x rsqrt(mean(x^2) + eps) w`` in fp32, as transformers computes it): the sum
      of n squares is off by at most gamma_{2n}(a) relative (2n roundings of at most a of it), the
      reciprocal square root by half that plus 2 a, the products 1 a, then the store and the
      weight's product 2 u: b = (gamma_{2n}(a) / 2 + 3 a + 2 u) |y|, v = ((n/2 + 5) a^2 + 2 u^2) |y|^2.
    - attention, at the input of ``o_proj``, per query t, head h, dim j, over the t + 1 keys s <= t.
      M_t = ||q_t|| max_s ||k_s|| / sqrt(d) bounds every score (Cauchy-Schwarz; RoPE keeps norms)
      and V_j = max_s |V_sj| every value and the output; a score moved by e moves the output by at
      most 2 e V_j, a probability moved by e relative by at most 2 e V_j too. Roundings: each score
      is d products, d - 1 sums and the scale, and RoPE rounds each element of q and k 5 times (2
      products, a sum, cos and sin), rs = 2d + 12 roundings of at most a M_t; the softmax's
      max-subtraction (a 2 M_t per score), exp (2 a relative), normaliser (t sums, a relative
      each) and division (a); the weighted sum, 2t + 1 roundings of at most a V_j; the store, u V_j:
      b = (2 gamma_rs(a) M_t + 4 a M_t + 2 gamma_{t+3}(a) + gamma_{2t+1}(a) + u) V_j,
      v = (rs (2 a M_t)^2 + (4 a M_t)^2 + (t + 5)(2 a)^2 + (2t + 1) a^2 + u^2) V_j^2.
    - the MLP's ``act(gate) * up`` (the input of ``down_proj``): SiLU as x / (1 + exp(-x)) (exp 2
      roundings, the sum and the division 1 each), the store, the product with ``up``, its store:
      b = (4 a + 2 u) |y|, v = (4 a^2 + 2 u^2) |y|^2.
    - the two residual sums of every decoder layer: u |h + y| each (b), (u |h + y|)^2 (v).

    The embedding lookup and the cast of the logits to fp32 (exact from fp32 or a 16-bit format)
    round nothing.
    """

    def __init__(self, model, p: Precision):
        self.p = p
        self.worst_sum, self.parts = 0.0, {}  # filled during the backward pass, site by site
        self.leaf: torch.Tensor | None = None
        self.handles: list = []
        self._h: dict[int, torch.Tensor] = {}  # decoder layer -> its input (residual stream)
        self._mid: dict[int, torch.Tensor] = {}  # decoder layer -> the residual after attention
        self._qkv: dict[int, dict[str, torch.Tensor]] = {}
        self.config = model.config
        self.handles.append(model.get_input_embeddings().register_forward_hook(self._leaf))
        for i, layer in enumerate(model.model.layers):
            attn = layer.self_attn
            self.handles.append(layer.register_forward_pre_hook(self._keep_input(self._h, i), with_kwargs=True))
            self.handles.append(layer.post_attention_layernorm.register_forward_pre_hook(self._keep_arg(self._mid, i)))
            for name in ("q_proj", "k_proj", "v_proj"):
                self.handles.append(getattr(attn, name).register_forward_hook(self._keep_output(i, name)))
            self.handles.append(attn.o_proj.register_forward_pre_hook(self._attention(i, attn)))
            self.handles.append(layer.mlp.down_proj.register_forward_pre_hook(self._act()))
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear):
                residual = None
                if name.endswith(("self_attn.o_proj", "mlp.down_proj")):
                    index = int(name.split(".layers.")[1].split(".")[0])
                    residual = (self._h if name.endswith("o_proj") else self._mid, index)
                self.handles.append(module.register_forward_hook(self._linear(residual)))
            elif type(module).__name__.endswith("RMSNorm"):
                self.handles.append(module.register_forward_hook(self._norm()))

    def close(self) -> None:
        for h in self.handles:
            h.remove()

    def _leaf(self, module, args, out):
        """The embedding's output as the graph's leaf: every later tensor gets a gradient, no weight does."""
        self.leaf = out.detach().requires_grad_(True)
        return self.leaf

    def _site(self, y: torch.Tensor, worst: torch.Tensor, var: torch.Tensor, kind: str) -> torch.Tensor:
        """Weigh ``y``'s rounding bounds by df/dy when the backward pass reaches it. ``worst`` and ``var`` come in
        units of a and a^2 (values of order one to n: fp32 holds them to 2^-24 relative).

        The weighted sums are taken in df/dy's own precision with torch's cascade summation, which keeps a sum of
        tens of millions of non-negative fp32 terms to ~1e-7 relative (measured against float64 on the LM
        head's 25 million: 8e-8), nothing beside the factor LAMBDA the bound carries."""
        a = self.p.acc
        w, v = worst.detach(), var.detach()

        def weigh(g: torch.Tensor) -> None:
            t = g.abs()  # one scratch tensor for both products (the LM head's are 25 million elements)
            self.worst_sum += a * float(t.mul_(w).sum())
            self.parts[kind] = self.parts.get(kind, 0.0) + a**2 * float(torch.mul(g, g, out=t).mul_(v).sum())

        y.register_hook(weigh)
        return y

    @staticmethod
    def _keep_input(store, i):
        def hook(module, args, kwargs):
            store[i] = (args[0] if args else kwargs["hidden_states"]).detach()

        return hook

    @staticmethod
    def _keep_arg(store, i):
        def hook(module, args):
            store[i] = args[0].detach()

        return hook

    def _keep_output(self, i, name):
        def hook(module, args, out):
            self._qkv.setdefault(i, {})[name] = out.detach()

        return hook

    def _linear(self, residual):
        p = self.p
        a = p.acc

        def hook(module, args, out):
            x, y = args[0].detach(), out.detach()
            n = x.shape[-1] + p.product_roundings + (module.bias is not None)
            m = x.abs() @ module.weight.abs().T
            if module.bias is not None:
                m += module.bias.abs()
            g = gamma(n, a)
            # in units of a: worst = gamma m / a, var = 2n ((1 + gamma) m)^2
            worst, var = m * (g / a), m.square_().mul_(2 * n * (1 + g) ** 2)
            extra = []
            if p.u > a:  # stored coarser than it was summed
                extra.append(y.abs())
            if residual is not None:  # the residual sum that follows: h + y, rounded once
                store, i = residual
                extra.append((store[i] + y).abs_())
            for r in extra:  # each a rounding of at most u |r|
                worst.add_(r, alpha=p.u / a)
                var.addcmul_(r, r, value=(p.u / a) ** 2)
            return self._site(out, worst, var, "matrix products")

        return hook

    def _norm(self):
        p = self.p
        a = p.acc

        def hook(module, args, out):
            n, y = args[0].shape[-1], out.detach().abs()
            worst = y * ((gamma(2 * n, a) / 2 + 3 * a + 2 * p.u) / a)
            var = y.square_().mul_((n / 2 + 5) + 2 * (p.u / a) ** 2)
            return self._site(out, worst, var, "norms")

        return hook

    def _act(self):
        p = self.p
        a = p.acc

        def hook(module, args):
            (y,) = args
            mag = y.detach().abs()
            worst = mag * (4 + 2 * p.u / a)
            return (self._site(y, worst, mag.square_().mul_(4 + 2 * (p.u / a) ** 2), "activation"),)

        return hook

    def _attention(self, i, attn):
        p, config = self.p, self.config
        a = p.acc

        def hook(module, args):
            (o,) = args  # [B, T, H * d]
            qkv = self._qkv[i]
            heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
            d = getattr(attn, "head_dim", None) or config.hidden_size // heads
            B, T, _ = o.shape
            group = heads // kv_heads
            q = qkv["q_proj"].reshape(B, T, heads, d)
            k = qkv["k_proj"].reshape(B, T, kv_heads, d)
            v = qkv["v_proj"].reshape(B, T, kv_heads, d)
            kmax = k.norm(dim=-1).cummax(dim=1).values.repeat_interleave(group, dim=2)  # [B, T, H]: over keys s <= t
            vmax = v.abs().cummax(dim=1).values.repeat_interleave(group, dim=2)  # [B, T, H, d]
            M = (q.norm(dim=-1) * kmax * attn.scaling)[..., None]  # [B, T, H, 1]: bounds |score|
            t = torch.arange(T, dtype=F64, device=o.device)[None, :, None, None]  # keys seen: t + 1
            rs = 2 * d + 12  # roundings per score
            worst = (2 * gamma(rs, a) * M + 4 * a * M + 2 * (t + 3) * a / (1 - (t + 3) * a) + (2 * t + 1) * a / (1 - (2 * t + 1) * a) + p.u) * vmax
            var = (rs * (2 * a * M) ** 2 + (4 * a * M) ** 2 + (t + 5) * (2 * a) ** 2 + (2 * t + 1) * a**2 + p.u**2) * vmax**2
            return (self._site(o, (worst / a).to(o.dtype).reshape(B, T, heads * d), (var / a**2).to(o.dtype).reshape(B, T, heads * d), "attention"),)

        return hook


def float64_copy(model):
    """A float64 copy of ``model`` (its weights as the lower-precision model holds them, exactly), for reference forwards."""
    return bound_copy(model, F64)


def bound_copy(model, dtype: torch.dtype = torch.float32):
    """A copy of ``model`` in ``dtype`` (default fp32) to evaluate a :func:`first_order_bound` in, where only the bound is used.

    The bound is a sum of rounding magnitudes weighted by gradients: evaluated in fp32 it moves by a relative ~1e-6
    (the perplexity bound of the stand-in's 2,048 tokens: 7e-8 from the float64 one), nothing beside the factor
    LAMBDA it carries, at half the cost of float64 on a CPU. Where the evaluated value itself is compared
    with a bound (a logit gap at a near-tie: :class:`GreedyJudge`), use :func:`float64_copy`. The model's weights
    must be exact in ``dtype`` (an fp32 or lower-precision model in fp32: they are)."""
    if torch.finfo(dtype).bits < max(torch.finfo(p.dtype).bits for p in model.parameters() if p.dtype.is_floating_point):
        raise ValueError(f"a {dtype} copy of a model with wider weights would round them")
    with torch.inference_mode(False):  # ordinary tensors, so that a bound can differentiate through them
        return copy.deepcopy(model).to(dtype).eval().requires_grad_(False)


def first_order_bound(model64, ids: torch.Tensor, f: Callable[[torch.Tensor], torch.Tensor], precision: Precision) -> Bound:
    """First-order bounds of ``|f(logits of any evaluation in precision) - f(exact)|`` over ``ids`` [B, T].

    One float64 forward (no cache) and one backward, whose gradient hooks sum, site by site and
    without keeping the gradients: ``sum over operations <|df/dy|, b>`` (worst)
    and ``LAMBDA sqrt(sum <(df/dy)^2, v>)`` (probable), with each operation's b and v from
    :class:`_Sites`. ``model64`` is the model in float64 (:func:`float64_copy`) or, where only the bound is used,
    in fp32 (:func:`bound_copy`); its own rounding is neglected, and so are second-order terms (products of two roundings).
    """
    sites = _Sites(model64, precision)
    try:
        with torch.inference_mode(False), torch.enable_grad():
            logits = model64(input_ids=ids.to(next(model64.parameters()).device), use_cache=False).logits
            value = f(logits)
            del logits
            torch.autograd.grad(value, [sites.leaf])  # the sites' hooks weigh their bounds as it passes
    finally:
        sites.close()
    probable = LAMBDA * math.sqrt(sum(sites.parts.values()))
    return Bound(float(value.detach()), sites.worst_sum, probable, {k: LAMBDA * math.sqrt(s) for k, s in sites.parts.items()})


# ------------------------------------------------------------------------------------------------
# two greedy continuations that should be equal
# ------------------------------------------------------------------------------------------------


@dataclass
class GreedyComparison:
    """Two greedy continuations of one prompt, compared up to rounding.

    ``equal``: token for token. Otherwise, at the first difference (``position``), ``gap`` is the
    float64 logit of the reference's token minus the other's, teacher-forced on the common prefix,
    and ``bound`` the first-order bound of that gap for an evaluation in the paths' precision.
    ``near_tie``: |gap| <= bound, so rounding alone can choose either token (each path's gap lies
    within ``bound`` of the exact one, and the two chose opposite signs); the continuations are
    compared no further, since after it they rightly go separate ways. ``agree`` is the verdict.
    """

    equal: bool
    position: int | None = None
    tokens: tuple[int, int] | None = None  # (reference's, other's) at ``position``
    gap: float = math.nan
    bound: float = math.nan

    @property
    def near_tie(self) -> bool:
        return not self.equal and abs(self.gap) <= self.bound

    @property
    def agree(self) -> bool:
        return self.equal or self.near_tie

    def describe(self) -> str:
        if self.equal:
            return "equal"
        if self.tokens is None:
            return f"DIFFER: one continuation ends at token {self.position}, the other goes on"
        kind = "near-tie" if self.near_tie else "DIFFER"
        return (f"{kind} at token {self.position}: {self.tokens[0]} vs {self.tokens[1]}, float64 logit gap {self.gap:.3g}, "
                f"first-order rounding bound {self.bound:.3g}")


@dataclass
class GreedyJudge:
    """Judges greedy continuations of one model against each other, up to its rounding (:func:`compare_greedy`).

    The float64 copy is made on the first difference only, and kept for the next.
    """

    model: object
    precision: Precision | None = None
    _model64: object = field(default=None, repr=False)

    def __call__(self, prompt: Sequence[int] | torch.Tensor, reference: Sequence[int] | torch.Tensor, other: Sequence[int] | torch.Tensor) -> GreedyComparison:
        ref, oth = _tokens(reference), _tokens(other)
        t = next((i for i, (a, b) in enumerate(zip(ref, oth)) if a != b), None)
        if t is None:
            if len(ref) == len(oth):
                return GreedyComparison(True)
            return GreedyComparison(False, min(len(ref), len(oth)))  # one stopped where the other went on: no gap to weigh
        if self._model64 is None:
            self._model64 = float64_copy(self.model)
        p = self.precision or Precision.of(next(self.model.parameters()).dtype)
        a, b = ref[t], oth[t]
        ids = torch.tensor([_tokens(prompt) + ref[:t]])  # [1, P + t]: the prefix both paths saw

        def gap(logits):  # [1, P + t, V]: the last position chooses token t
            return logits[0, -1, a] - logits[0, -1, b]

        bound = first_order_bound(self._model64, ids, gap, p)
        return GreedyComparison(False, t, (a, b), bound.value, bound.probable)


def compare_greedy(model, prompt, reference, other, precision: Precision | None = None) -> GreedyComparison:
    """Compare two greedy continuations of ``prompt`` by ``model`` (see :class:`GreedyComparison`)."""
    return GreedyJudge(model, precision)(prompt, reference, other)


def _tokens(x) -> list[int]:
    if isinstance(x, torch.Tensor):
        return [int(t) for t in x.reshape(-1).tolist()]
    return [int(t) for t in x]
