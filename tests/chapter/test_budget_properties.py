"""Properties of the budget section's code that are not claims of the book: the budget's search."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cheapinfer.chapter.budget import budget
from cheapinfer.chapter.budget.budget import GIB, MODELS, TABLE_BITS


@given(
    model=st.sampled_from(tuple(MODELS)),
    bits=st.floats(1.0, 32.0),
    memory=st.floats(0.5, 512.0),
)
def test_budget_is_the_largest_token_count_that_fits(model, bits, memory):
    """The sum holds: weights + reserve + T x bytes/token <= memory < the same with T + 1 (when the weights fit)."""
    b = budget.budget(model, bits, memory)
    total = memory * GIB
    used = b.weights_bytes + b.reserve_bytes
    if b.fits:
        assert used + b.tokens * b.kv_bytes_per_token <= total < used + (b.tokens + 1) * b.kv_bytes_per_token
    else:
        assert b.tokens == 0 and used > total


@given(model=st.sampled_from(tuple(MODELS)), bits=st.sampled_from(TABLE_BITS), small=st.floats(0.5, 256.0), more=st.floats(0.0, 256.0))
def test_more_memory_never_leaves_fewer_tokens(model, bits, small, more):
    """The sum is monotone: the same model and precision never get fewer tokens from more memory."""
    assert budget.budget(model, bits, small).tokens <= budget.budget(model, bits, small + more).tokens
