"""Section 8 of the chapter: the budget is one sum, weights + KV bytes per token x resident tokens."""

import pytest

from cheapinfer.chapter.budget import budget


@pytest.mark.claim("BUD-13B-8GB")
def test_13b_at_4_bits_on_8_gb_leaves_337_tokens(claim):
    """BUD-13B-8GB: "The weights fit — 6.2 GB of 8 — ... It has 337 tokens of context"."""
    b = budget.budget("13b", 4.125, 8)
    claim.note(f"Assumptions: {budget.ASSUMPTIONS}.")
    claim.verify("arithmetic", weights_gib=b.weights_gib, tokens=b.tokens, weights_bytes=b.weights_bytes)


@pytest.mark.claim("BUD-16GB-INT8")
def test_16_gb_int8_gives_7b_65378_and_13b_3136_tokens(claim):
    """BUD-16GB-INT8: "The 7B gets 65,378 tokens and the 13B gets 3,136 — a twentyfold difference from 5.6 GB more weights"."""
    b7, b13 = budget.budget("7b", 8, 16), budget.budget("13b", 8, 16)
    claim.note(f"Assumptions: {budget.ASSUMPTIONS}.")
    claim.verify(
        "arithmetic",
        tokens_7b=b7.tokens,
        tokens_13b=b13.tokens,
        extra_weights_gib=b13.weights_gib - b7.weights_gib,
        fold=b7.tokens / b13.tokens,
    )


@pytest.mark.claim("BUD-13B-800KB")
def test_13b_mha_cache_is_800_kb_per_token_vs_128_kb(claim):
    """BUD-13B-800KB: "the 13B has multi-head attention here and its cache costs 800 KB per token against 128 KB for the 7B";
    "de 7B- en 70B-rijen gaan uit van 8 key-value heads met dimension 128"."""
    m13, m7 = budget.MODELS["13b"], budget.MODELS["7b"]
    rows_70b = {b.kv_bytes_per_token for rows in budget.tables().values() for b in rows if b.model == "70B"}
    claim.note(f"The 70B rows of the regenerated tables carry {sorted(rows_70b)} B of cache per token.")
    claim.verify(
        "arithmetic",
        bytes_13b=m13.kv_bytes_per_token,
        bytes_7b=m7.kv_bytes_per_token,
        bytes_70b=rows_70b.pop() if len(rows_70b) == 1 else None,
        shape_13b=f"{m13.layers} layers x {m13.kv_heads} KV heads x {m13.head_dim}",
        shape_7b=f"{m7.layers} layers x {m7.kv_heads} KV heads x {m7.head_dim}",
    )


@pytest.mark.claim("BUD-TABLES")
def test_budget_tables_regenerate_the_quoted_cells(claim):
    """BUD-TABLES: the 8 / 16 / 24 GB tables (lost in the copies); the prose quotes 13,0 GB, 6,2 GB and 337, 65,378 and 3,136 from them."""
    tables = budget.tables()
    for memory, rows in tables.items():
        claim.table(f"{memory:g} GB", budget.TABLE_HEADER, budget.table_rows(rows))
    cell = {(m, b.model, b.bits): b for m, rows in tables.items() for b in rows}
    windows = {
        "337 (13B, 4.125 bits, 8 GiB)": budget.reserve_window("13b", 4.125, 8, 337),
        "65,378 (7B, int8, 16 GiB)": budget.reserve_window("7b", 8, 16, 65_378),
        "3,136 (13B, int8, 16 GiB)": budget.reserve_window("13b", 8, 16, 3_136),
    }
    claim.table("Reserves (GiB) under which each printed count holds: (lo, hi]", ["printed count", "lo", "hi"], [[k, f"{lo:.6f}", f"{hi:.6f}"] for k, (lo, hi) in windows.items()])
    claim.note(f"Assumptions: {budget.ASSUMPTIONS}. Cells marked 'does not fit' have weights plus reserve above the memory size.")
    claim.verify(
        "arithmetic",
        weights_7b_16bit_gib=cell[16.0, "7B", 16.0].weights_gib,
        weights_13b_4bit_gib=cell[8.0, "13B", 4.125].weights_gib,
        tokens_8gb_13b_4bit=cell[8.0, "13B", 4.125].tokens,
        tokens_16gb_7b_8bit=cell[16.0, "7B", 8.0].tokens,
        tokens_16gb_13b_8bit=cell[16.0, "13B", 8.0].tokens,
        extra_weights_16gb_8bit_gib=cell[16.0, "13B", 8.0].weights_gib - cell[16.0, "7B", 8.0].weights_gib,
        reserve_window_gib=[max(lo for lo, _ in windows.values()), min(hi for _, hi in windows.values())],
        cells_not_the_most_that_fit=[f"{m:g} GB, {b.model}, {b.bits:g} bits: {b.tokens:,}" for m, rows in tables.items() for b in rows if not _most_that_fit(b)],
    )


def _most_that_fit(b: budget.Budget) -> bool:
    """Whether a cell's token count is the most whose cache fits beside its weights and reserve, recomputed from the
    cell's own bytes: ``tokens`` caches fit and one more does not (0 where the weights and reserve alone overflow)."""
    free = b.memory_gib * budget.GIB - b.reserve_bytes - b.weights_bytes
    if free < 0:
        return b.tokens == 0 and not b.fits
    return b.fits and b.tokens * b.kv_bytes_per_token <= free < (b.tokens + 1) * b.kv_bytes_per_token
