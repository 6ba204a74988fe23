"""The book model's architecture, written down as facts.

Qwen2.5-0.5B-Instruct's published ``config.json`` values. The twin profile is built from these, so
every claim about bytes, FLOPs, cache shapes and timings runs without the real weights.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    qkv_bias: bool
    rope_theta: float
    rms_norm_eps: float
    max_position: int

    @property
    def projections_per_layer(self) -> int:
        return 7  # q, k, v, o, gate, up, down

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        """``(out_features, in_features)`` of the seven projection matrices of one layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "self_attn.q_proj": (q, self.hidden),
            "self_attn.k_proj": (kv, self.hidden),
            "self_attn.v_proj": (kv, self.hidden),
            "self_attn.o_proj": (self.hidden, q),
            "mlp.gate_proj": (self.intermediate, self.hidden),
            "mlp.up_proj": (self.intermediate, self.hidden),
            "mlp.down_proj": (self.hidden, self.intermediate),
        }

    def parameter_count(self) -> int:
        """All parameters, counted from the shapes (embedding counted once when tied)."""
        per_layer = sum(o * i for o, i in self.projection_shapes().values())
        if self.qkv_bias:
            per_layer += (self.heads + 2 * self.kv_heads) * self.head_dim
        per_layer += 2 * self.hidden  # input and post-attention RMSNorm
        embed = self.vocab * self.hidden
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.layers * per_layer + embed + head + self.hidden  # final norm

    def kv_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """Keys and values, every layer: 2 x layers x kv_heads x head_dim x bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_element


#: Qwen2.5-0.5B (Instruct and base share it).
QWEN25_05B = Arch(
    name="Qwen2.5-0.5B",
    layers=24,
    hidden=896,
    heads=14,
    kv_heads=2,
    head_dim=64,
    intermediate=4864,
    vocab=151_936,
    tied_embeddings=True,
    qkv_bias=True,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    max_position=32_768,
)

BOOK_REPOS = {
    "instruct": "Qwen/Qwen2.5-0.5B-Instruct",
    "base": "Qwen/Qwen2.5-0.5B",
}


def qwen2_config(arch: Arch = QWEN25_05B, **overrides):
    """A ``transformers.Qwen2Config`` for ``arch`` (eager attention unless overridden)."""
    from transformers import Qwen2Config

    kwargs = dict(
        vocab_size=arch.vocab,
        hidden_size=arch.hidden,
        intermediate_size=arch.intermediate,
        num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads,
        num_key_value_heads=arch.kv_heads,
        max_position_embeddings=arch.max_position,
        rope_theta=arch.rope_theta,
        rms_norm_eps=arch.rms_norm_eps,
        tie_word_embeddings=arch.tied_embeddings,
        hidden_act="silu",
        bos_token_id=151_643,
        eos_token_id=151_645,
    )
    kwargs.update(overrides)
    config = Qwen2Config(**kwargs)
    return config
