"""What the claim tests (``claims/``) and the suite's own tests import besides the package's measurements: the
profile parametrization and the shared Hypothesis strategies. Test helpers only: nothing in the package imports
this module (``tests/test_layout.py``), so the package works without pytest or Hypothesis installed.

The plugin's own modules (``fixtures/``) are never imported by a test: they are pytest plugins, loaded once.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp


def on_profiles(*names: str):
    """Parametrize a test over model profiles; the book profile carries the ``book`` marker."""
    params = [pytest.param(n, id=n, marks=[pytest.mark.book] if n == "book" else []) for n in names]
    return pytest.mark.parametrize("profile", params, indirect=True)


# Hypothesis strategies
# ----------------------------------------------------------------------------------------------

#: The integer schemes of the suite's quantizer (``cheapinfer.chapter.quantization.quant``).
INT_SCHEMES = ("int8-tensor", "int8-row", "int8-g32", "int4-tensor", "int4-row", "int4-g128", "int4-g16")

_magnitude = st.one_of(st.just(0.0), st.floats(2.0**-10, 2.0**10, width=32))

#: fp32 weight matrices ``[1..6, 1..300]``: zeros and magnitudes over 20 binades, either sign.
weights = hnp.arrays(
    np.float32,
    st.tuples(st.integers(1, 6), st.integers(1, 300)),
    elements=st.tuples(_magnitude, st.booleans()).map(lambda t: -t[0] if t[1] else t[0]),
)
#: ``weights`` with a nonzero entry: the book's absmax listing divides by max |W|.
nonzero_weights = weights.filter(lambda a: bool(np.abs(a).max() > 0))
