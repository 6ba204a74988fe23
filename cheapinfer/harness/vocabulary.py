"""The records' words, which every harness module reads and which import nothing of the package: the verdicts, what a
claim ID is, what marks a harness error, the fault record's verdicts and modes, and the environment entries that
decide verdicts.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

REPRODUCED = "reproduced"
SHAPE_HOLDS = "shape holds"
ERRATUM = "erratum"

DEVIATES = "deviates"
NOT_RUN = "not run"
NO_TEST = "no test yet"
INCONCLUSIVE = "inconclusive"
VERDICTS = (REPRODUCED, SHAPE_HOLDS, ERRATUM, INCONCLUSIVE, DEVIATES, NOT_RUN, NO_TEST)
#: Verdicts of a passing test; a confirmed erratum passes (its digits fail as documented).
PASSING = (REPRODUCED, SHAPE_HOLDS, ERRATUM)
#: Verdicts from which a change to *deviates* (or a harness error) is a regression: a passing one, or one that
#: could not decide (a measurement that now decides red was not red before).
BREAKABLE = (*PASSING, INCONCLUSIVE)

#: What a claim ID is: groups of upper-case letters, digits and '.' joined by '-' (KV-MHA-7X, KV-MEMORY-8.3X), at
#: most 40 characters.
ID_PATTERN = re.compile(r"[A-Z0-9][A-Z0-9.]*(?:-[A-Z0-9][A-Z0-9.]*)*")
ID_MAX = 40


def valid_id(claim_id: object) -> bool:
    """Whether ``claim_id`` is a claim ID of the registry's form (:data:`ID_PATTERN`): nothing a terminal obeys."""
    return isinstance(claim_id, str) and len(claim_id) <= ID_MAX and ID_PATTERN.fullmatch(claim_id) is not None


#: How the reason of a result that is *not run* because its test raised before a verdict (an error, not a skip) begins,
#: for a reader; what says so is its ``harness_error`` field (records of schema 1 said it by this prefix only, and
#: :func:`cheapinfer.harness.schema.upgrade` reads them so).
ERROR_REASON = "error before a verdict"


def is_harness_error(result: Mapping[str, Any]) -> bool:
    """A result (``schema.ResultEntry``) that is *not run* because its test raised before a verdict, not because it was
    skipped: its field, never its reason's words."""
    return result.get("verdict") == NOT_RUN and bool(result.get("harness_error"))


#: The fault record's verdicts of a target claim (``schema.FaultEntry``): the fault turned it red, or the sweep did
#: not run it (another claim had already caught the fault in that run); and the two modes of a fault run.
RED = "red"
NOT_REACHED = "not reached"
SWEEP, ALL_TARGETS = "sweep", "all targets"

#: The environment entries a reader needs to compare two runs, in the order the report shows them.
KEY_ENVIRONMENT = ("cpu", "gpu", "driver", "cuda", "torch", "transformers", "bitsandbytes", "gguf")
