"""Properties of the outliers section's code that are not claims of the book: the outlier scan takes magnitudes."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from cheapinfer.chapter.outliers import outliers


@given(seed=st.integers(0, 2**32 - 1))
def test_the_outlier_scan_takes_magnitudes_and_a_signed_scan_is_caught(seed):
    """The scan's maxima are of |h|, so a maximum reached below zero counts; one of signed values fails the check."""
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(3, 5, 4, generator=g)  # [layers + 1, tokens, hidden]
    states[1, 2, 3] = -50.0  # one maximum reached below zero, whatever the draw
    covered, below_zero = outliers.signs_covered(states, outliers.outlier_stats(states))
    assert covered and below_zero >= 1
    assert float(outliers.outlier_stats(states).per_layer_dim_max[1, 3]) == 50.0
    signed = outliers.OutlierStats(states.amax(dim=1), states.shape[0] - 1)
    assert outliers.signs_covered(states, signed) == (False, below_zero)
