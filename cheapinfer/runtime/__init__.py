"""What the chapter's sections stand on: devices and accelerators (``accel``, ``device``), clocks and
interleaved timing (``timing``), evidence that a loop did what its claim is about (``evidence``),
rounding bounds (``rounding``), what a decode step streams and how fast against the copy bandwidth
(``roofline``), the claims' figures (``plots``), model profiles (``arch``, ``models``, ``profiles``: which of them run a model,
without torch), pinned artifacts and the corpus
(``artifacts``, ``corpus``), the process's memory (``memory``, without torch), the command-line helpers (``cli``), and ``hf``, the one place that speaks to
transformers (cache keyword, Cache subclass API, tokenizer conventions, meta-device construction).

May import: other modules of this folder only (``tests/test_layout.py``).
"""
