"""Section 1 of the chapter: the KV cache."""

import pytest

from cheapinfer import kv
from cheapinfer.arch import QWEN25_05B


@pytest.mark.claim("KV-BYTES-FORMULA")
def test_kv_cache_is_12288_bytes_per_token(claim):
    """KV-BYTES-FORMULA: "bytes/token = 2 x layers x kv_heads x head_dim x bytes = 2x24x2x64x2"."""
    claim.verify("arithmetic", bytes_per_token=kv.arch_kv_bytes_per_token(QWEN25_05B, 2))
