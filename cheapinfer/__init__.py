"""Executable claims of the chapter "Making inference cheap: KV cache, batching and quantization".

The package has six wings; imports go down or sideways, never up (``tests/test_layout.py``):

- ``chapter/``: the book, one module per section and what it measures (``kv``, ``batching``,
  ``quant``, ``evaluation``, ``speculative``, ...). Imports ``runtime/`` only.
- ``runtime/``: what the sections stand on: devices, clocks, models and profiles, pinned artifacts,
  and ``hf``, the one place that speaks to transformers. Imports nothing else of the package.
- ``harness/``: claim -> verdict -> record -> report, ``compare`` and ``merge``. No torch.
- ``faults/``: the catalogue of faults in the measured system.
- ``audits/``: the claims run under a perturbation (each fault, each CPU kernel family, load) and their verdicts
  compared; the only wing that starts processes.
- ``reference/``: the vLLM engine and its report (optional, ``tox -e vllm``).

Everything here works without pytest; the tests under ``claims/`` are a thin layer on top.
"""

import os
from pathlib import Path

# Nothing in this suite may fetch weights from a hub at run time. Set before any
# huggingface_hub import so that every loader in the process sees it.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

#: The one seed of the suite. Every random thing (twin weights, prompts, simulations) derives from it.
SEED = 20241

__version__ = "0.1.0"

#: The checkout this package was imported from (``claims/``, ``reports/`` and ``pyproject.toml`` live there).
CHECKOUT = Path(__file__).resolve().parent.parent
