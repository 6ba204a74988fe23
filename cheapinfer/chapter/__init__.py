"""The book: one module per section of the chapter (or per part of a long section), and what its claims measure.

- KV cache: ``kv`` (bytes, generation with and without the cache, timing helpers), ``kv_macs``,
  ``kv_listing`` (the chapter's listing run as printed), ``kv_evidence`` (a cached step used its cache);
- batching: ``batching`` (the batch curve), ``batch_curve`` (the setting its claims share and the curve's
  clocked quantities), ``knee``, ``workload`` (the book's workload and the
  simulation), ``scheduler`` and ``paged_scheduler`` (the real runs), ``paging`` (the paged KV cache);
- quantization: ``quant`` (the quantizers), ``quant_error``, ``lowbit`` (real low-bit kernels), ``formats``
  (what the libraries store), ``outliers``, ``crosscheck`` (the quantizers against the libraries);
- does quantization hurt: ``perplexity``, ``battery``, ``evaluation`` (agreement and the table), ``independence``;
- ``speculative``, ``distill``, ``budget`` and ``asides``.

May import: ``cheapinfer.runtime`` and other modules of this folder. Never ``harness``, ``faults`` or
``reference`` (``tests/test_layout.py``).
"""
