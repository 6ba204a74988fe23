"""The catalogue of faults, as the plugin and the runner read it: every fault by name, one activated, the faults that
name a claim, and the last fault sweep's record. What a fault is and how one is written: :mod:`cheapinfer.faults.base`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ContextManager

from .base import FAULTS, KINDS, Fault, inapplicable  # noqa: F401  (KINDS, inapplicable: the catalogue's vocabulary, read here too)

if TYPE_CHECKING:
    from ..harness.schema import FaultRecord



def catalogue() -> dict[str, Fault]:
    """Every registered fault, by name (importing the catalogue's modules registers them)."""
    from . import catalogue as _registers  # noqa: F401  (importing the catalogue registers its faults)

    return dict(FAULTS)


def activate(name: str) -> ContextManager[None]:
    faults = catalogue()
    if name not in faults:
        raise KeyError(f"no such fault: {name} (python -m cheapinfer faults --list)")
    return faults[name].activate()


def targeted_by(claim_id: str) -> list[str]:
    """The faults that name ``claim_id`` as a claim they turn red."""
    return [f.name for f in catalogue().values() if claim_id in f.targets]


def last_run(report_dir: Path) -> FaultRecord | None:
    """The last fault record written into ``report_dir``, checked (:func:`cheapinfer.harness.schema.check_fault_record`);
    None where there is none or it is not one."""
    from ..harness.schema import FAULTS_NAME, read_fault_record

    try:
        return read_fault_record(Path(report_dir) / FAULTS_NAME)
    except (OSError, ValueError):
        return None
