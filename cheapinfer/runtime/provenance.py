"""Which measured path a value was read from: a cross-check must read the result of the path that makes the number it
guards, not a second computation beside it.

A claim's cross-check (the registry's ``reads``) names the function whose result both the check and the quantities it
``guards`` are derived from. :func:`moved` runs a measurement twice, the second time with that path's results
perturbed (:func:`perturbed`: every float in them scaled by its own factor, so that no ratio of two of them cancels
it); a value derived from the path's result moves, a value computed on another path (a fresh call of the quantizer
beside the table it vouches for) stays where it was. :func:`traced` does the same to the function itself, by its
dotted name, for a measurement that calls it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
from typing import Any, Callable, Iterator, Mapping, Sequence


def perturbed(result: Any, salt: int = 0) -> Any:
    """A copy of ``result`` with every float (and every floating-point tensor) scaled by its own factor in [0.5, 0.9),
    the k-th one met by ``0.5 + 0.4 * frac(k * golden ratio)``: two floats never move by the same factor, so a ratio, a
    minimum or a mean of them moves too. Integers, booleans and strings stay (names, counts and flags are not
    measurements a cross-check reads). Dataclasses, mappings, lists and tuples are walked; anything else is kept."""
    counter = [salt]

    def factor() -> float:
        counter[0] += 1
        return 0.5 + 0.4 * math.modf(counter[0] * 0.6180339887498949)[0]

    def walk(x: Any) -> Any:
        if isinstance(x, float):
            return x * factor()
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return dataclasses.replace(x, **{f.name: walk(getattr(x, f.name)) for f in dataclasses.fields(x) if f.init})
        if isinstance(x, Mapping):
            return type(x)({k: walk(v) for k, v in x.items()}) if isinstance(x, dict) else {k: walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
            return type(x)(walk(v) for v in x)
        if type(x).__name__ == "Tensor" and getattr(x, "is_floating_point", lambda: False)():
            import torch

            n = x.numel()
            scale = torch.tensor([factor() for _ in range(min(n, 64))], dtype=x.dtype, device=x.device)
            return x * scale.repeat(n // scale.numel() + 1)[:n].reshape(x.shape)
        return x

    return walk(result)


def _differs(a: Any, b: Any) -> bool:
    try:
        return bool(a != b)
    except (TypeError, RuntimeError):  # a tensor's elementwise != has no single truth value
        return not bool((a == b).all())


def moved(measure: Callable[[Callable], Mapping[str, Any]], path: Callable, names: Sequence[str]) -> dict[str, bool]:
    """For each of ``names``, whether its value moves when ``path``'s results are perturbed: ``measure(path)`` is run with
    the path as it is and with a path whose every result goes through :func:`perturbed`. True for a value read from the
    path's result; False for one computed on another path (or a name the measurement does not give)."""
    plain = measure(path)
    shaken = measure(lambda *args, **kwargs: perturbed(path(*args, **kwargs)))
    return {n: n in plain and n in shaken and _differs(plain[n], shaken[n]) for n in names}


def resolve(dotted: str) -> tuple[Any, str, Callable]:
    """``cheapinfer.chapter.quantization.quant_error.error_table`` -> (its module, the attribute's name, the function)."""
    module_name, _, attribute = dotted.rpartition(".")
    module = importlib.import_module(module_name)
    function = getattr(module, attribute, None)
    if not callable(function):
        raise LookupError(f"{dotted} names no function")
    return module, attribute, function


@dataclasses.dataclass
class Trace:
    """What :func:`traced` saw of its path: how many calls went through it."""

    calls: int = 0


@contextlib.contextmanager
def traced(dotted: str, perturb: bool = False) -> Iterator[Trace]:
    """The function named ``dotted`` replaced, for the duration, at its module by a wrapper that counts its calls and,
    with ``perturb``, hands back each result through :func:`perturbed`. Every caller that looks the function up on its
    module (a call by its bare name within the module does) goes through the wrapper."""
    module, attribute, function = resolve(dotted)
    trace = Trace()

    def wrapper(*args, **kwargs):
        trace.calls += 1
        result = function(*args, **kwargs)
        return perturbed(result) if perturb else result

    setattr(module, attribute, wrapper)
    try:
        yield trace
    finally:
        setattr(module, attribute, function)


def reads(measure: Callable[[], Mapping[str, Any]], dotted: str, names: Sequence[str]) -> dict[str, bool]:
    """For each of ``names``, whether ``measure()`` reads it from the function named ``dotted``: the path was called, and
    the value moves when the path's results are perturbed (:func:`traced`)."""
    with traced(dotted) as seen:
        plain = measure()
    with traced(dotted, perturb=True):
        shaken = measure()
    return {n: seen.calls > 0 and n in plain and n in shaken and _differs(plain[n], shaken[n]) for n in names}
