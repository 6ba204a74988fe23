"""The book: one module per section of the chapter, and what each section's claims measure.

``kv`` (the KV cache), ``batching`` and ``paging`` (batching, schedulers, the paged cache), ``quant``,
``lowbit``, ``formats`` and ``outliers`` (quantization), ``evaluation`` and ``independence`` (the error
table and its statistics), ``speculative``, ``distill``, ``budget`` and ``asides``; ``crosscheck``
holds the library cross-checks of the suite's own quantizers.

May import: ``cheapinfer.runtime`` and other modules of this folder. Never ``harness``, ``faults`` or
``reference`` (``tests/test_layout.py``).
"""
