"""Executable claims of the chapter "Making inference cheap: KV cache, batching and quantization".

One measurement module per chapter section (``kv``, ``batching``, ``quant``, ``outliers``,
``evaluation``, ``speculative``, ``distill``, ``budget``, ``asides``), the claim registry
(``registry``), the three model profiles (``models``) and the report writer (``report``).
Everything here works without pytest; the test suite under ``claims/`` is a thin layer on top.
"""

import os

# Nothing in this suite may fetch weights from a hub at run time. Set before any
# huggingface_hub import so that every loader in the process sees it.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

#: The one seed of the suite. Every random thing (twin weights, prompts, simulations) derives from it.
SEED = 20241

__version__ = "0.1.0"
