"""The catalogue of faults, one module per section of the chapter (see :mod:`cheapinfer.faults.base`).

Every fault is a realistic bug in the measured system or a library regression, written as a patch of
the measurement code that the claims' tests call. Each names the claims it must turn red. Importing
this package registers every fault, in the book's order.
"""

from . import batching, bounds, budget, evaluation, kv, outliers, quantization, speculative  # noqa: F401  (each registers its faults)
