"""The book: one package per section of the chapter, named as the registry, ``claims/`` and ``faults/catalogue/`` name
that section (``tests/test_layout.py`` holds them to one name), and what its claims measure.

- ``kv_cache``: ``kv`` (bytes, generation with and without the cache, timing helpers), ``kv_macs``, ``kv_listing``
  (the chapter's listing run as printed), ``kv_memory``, ``kv_evidence`` (a cached step used its cache);
- ``batching``: ``batching`` (the batch curve), ``batch_curve`` (the setting its claims share and the curve's clocked
  quantities), ``knee``, ``workload`` (the book's workload and the simulation), ``scheduler`` and ``paged_scheduler``
  (the real runs), ``paging`` (the paged KV cache);
- ``quantization``: ``quant`` (the quantizers), ``quant_error``, ``lowbit`` (real low-bit kernels), ``formats`` (what
  the libraries store), ``crosscheck`` (the quantizers against the libraries);
- ``outliers``; ``evaluation`` (does quantization hurt: ``perplexity``, ``battery``, ``evaluation``, agreement and the
  table); ``speculative``; ``distillation`` (``distill``); ``budget``; ``asides``.

One module stays at this level: ``stats``, the statistics of the measurements (tests, intervals, design effects: the
battery's exact interval and McNemar's test, the agreement's permutation test and design effect), each with its test,
level and assumption; it belongs to no one section, and keeping them in one place keeps their statements together.
A module that serves several sections lives in the section whose claims it was written for (``kv_cache.kv``'s caches
are batched in ``batching``, ``quantization.quant``'s schemes are evaluated in ``evaluation``), imported from there.

May import: ``cheapinfer.runtime`` and other modules of this folder. Never ``harness``, ``faults`` or
``reference`` (``tests/test_layout.py``).
"""
