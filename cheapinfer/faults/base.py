"""What a fault is, and how one is written (the catalogue's vocabulary).

A fault is a realistic bug in the measured system or a library regression, written as a context manager
that patches the measurement code (never the registry, never a test) and names the claims it is expected
to turn red. A fault is registered with :func:`fault`::

    @fault("kv-decode-ignores-cache", section="kv_cache", kind=DISABLED, targets=("KV-DECODE-FLAT",),
           what="the decode step drops the cache it is given and recomputes the whole history")
    def _():
        with patched(kv, "decode_step", broken_decode_step):
            yield
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, Mapping
from unittest import mock

DISABLED = "disabled optimisation"
CONSTANT = "wrong constant"
RULE = "wrong rule"
STATISTIC = "wrong statistic"
KINDS = (DISABLED, CONSTANT, RULE, STATISTIC)


@dataclass(frozen=True)
class Fault:
    name: str
    section: str
    kind: str
    what: str  # the realistic bug, in one sentence
    targets: tuple[str, ...]  # the claims it is expected to turn red
    activate: Callable[[], ContextManager[None]]
    #: library -> PEP 440 specifier of the releases the bug can exist on ({}: all). A fault modelling a regression of
    #: transformers 5.x has nothing to break on 4.x: there it is not applicable, never missed (:func:`inapplicable`).
    applies: Mapping[str, str] = field(default_factory=dict)


FAULTS: dict[str, Fault] = {}


def fault(name: str, *, section: str, kind: str, targets: tuple[str, ...], what: str, applies: Mapping[str, str] | None = None):
    """Register the decorated generator (patch, ``yield``, restore) as the fault ``name`` (``applies``: see :class:`Fault`)."""
    if kind not in KINDS:
        raise ValueError(f"fault {name}: kind must be one of {KINDS}")
    if not targets:
        raise ValueError(f"fault {name}: names no claim it turns red")

    def register(gen: Callable[[], Iterator[None]]) -> Callable[[], Iterator[None]]:
        if name in FAULTS:
            raise ValueError(f"fault {name} registered twice")
        FAULTS[name] = Fault(name, section, kind, what, tuple(targets), contextlib.contextmanager(gen), dict(applies or {}))
        return gen

    return register


def inapplicable(f: Fault, versions: Mapping[str, str | None] | None = None) -> str | None:
    """Why ``f`` cannot exist with these library versions (default: the installed ones), or None where it can. A version
    that cannot be read, or a library that is not installed, leaves the fault applicable: it is run, and judged
    (:func:`cheapinfer.harness.registry.outside_releases`, which errata read too)."""
    from ..harness.registry import outside_releases
    from ..runtime.device import installed_version

    if versions is None:
        versions = {library: installed_version(library) for library in f.applies}
    outside = outside_releases(f.applies, versions)
    return None if outside is None else f"models {outside[0]} {outside[1]}; this environment has {outside[0]} {outside[2]}"


def patched(target: Any, attribute: str, replacement: Any) -> ContextManager[Any]:
    """``target.attribute`` replaced for the duration; the attribute must exist (a renamed function
    must not leave a fault silently inert)."""
    if not hasattr(target, attribute):
        raise AttributeError(f"fault patches {getattr(target, '__name__', target)}.{attribute}, which does not exist")
    return mock.patch.object(target, attribute, replacement)


def result_mapped(target: Any, attribute: str, transform: Callable[[Any], Any]) -> ContextManager[Any]:
    """``target.attribute``, a function, wrapped for the duration so that its result passes through ``transform``: the
    narrowest patch of a fault in what a function returns (the function itself stays the original)."""
    real = getattr(target, attribute, None)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return transform(real(*args, **kwargs))

    return patched(target, attribute, wrapper)


@dataclass(frozen=True)
class SuiteFault:
    """A fault of the suite's own code (its text checks, its record readers, its statistics), not of the measured
    system: the self-test it must turn red is named by ``check``."""

    name: str
    check: str  # the suite's check it must turn red, one of its registry's checks
    what: str  # the bug, in one sentence
    activate: Callable[[], ContextManager[None]]


def suite_faults(kind: str, checks: tuple[str, ...]) -> tuple[dict[str, SuiteFault], Callable[..., Any]]:
    """A registry of :class:`SuiteFault` and its decorator ``register(name, check, what)``, which turns a generator that
    holds the fault into its context manager; a name registered twice or an unknown check is refused."""
    registry: dict[str, SuiteFault] = {}

    def fault_of(name: str, check: str, what: str):
        def register(gen: Callable[[], Iterator[None]]) -> Callable[[], Iterator[None]]:
            if name in registry or check not in checks:
                raise ValueError(f"{kind} fault {name}: registered twice, or for an unknown check {check!r}")
            registry[name] = SuiteFault(name, check, what, contextlib.contextmanager(gen))
            return gen

        return register

    return registry, fault_of
