"""Numbers as the registry and the reports read and print them (torch-free; imports nothing of the package)."""

from __future__ import annotations

import json
import math
from typing import Any


def is_number(value: Any) -> bool:
    """An int or a float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def margin_text(margin: float) -> str:
    """A margin in standard errors as the reports print it: truncated to two decimals (2.997 is not "3.0", which
    would read as enough to decide)."""
    return f"{math.floor(margin * 100) / 100:.2f}" if math.isfinite(margin) else str(margin)


def fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value == 0 or not math.isfinite(value):
            return str(value)
        if abs(value) >= 1e6 or abs(value) < 1e-3:
            return f"{value:.4g}"
        return f"{value:.6g}"
    return str(value)


def value_text(value: Any) -> str:
    """A measured or book value as the reports and ``compare`` print it: :func:`fmt`, or JSON for a table or a list."""
    return fmt(value) if not isinstance(value, (dict, list)) else json.dumps(value)
