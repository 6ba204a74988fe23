"""The catalogue of faults, one module per section of the chapter, named as the registry names the section (see
:mod:`cheapinfer.faults.base`); :mod:`.patches` holds the patch techniques several sections' faults share.

Every fault is a realistic bug in the measured system or a library regression, written as a patch of
the measurement code that the claims' tests call. Each names the claims it must turn red. Importing
this package registers every fault, in the book's order.
"""

from . import kv_cache, batching, quantization, outliers, evaluation, speculative, distillation, budget, asides  # noqa: F401, I001  (each registers its faults, in the book's order)
