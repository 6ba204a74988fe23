"""Properties of the distillation section's code that are not claims of the book: the temperature's root."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from cheapinfer.chapter.distillation import distill


@given(st.lists(st.floats(-30, 30, width=32), min_size=3, max_size=64, unique=True), st.floats(0.25, 8.0))
def test_temperature_takes_a_root_of_every_ratio(logits, t):
    """A plain property of the package (the claim above is checked on measured logits)."""
    z = torch.tensor(logits, dtype=torch.float32)
    p1, pt = distill.distribution(z), distill.distribution(z, t)
    i, j = int(torch.argmax(z)), int(torch.argmin(z))
    got, want = float(pt[i] / pt[j]), float(p1[i] / p1[j]) ** (1 / t)
    assert abs(got / want - 1) <= distill.root_ratio_bound(z, t, i, j)
    assert distill.order_unchanged(z, t)
