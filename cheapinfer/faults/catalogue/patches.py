"""Patch techniques the sections' faults share: a cache handed over under a keyword no release takes, and
steps that replay their first result."""

from __future__ import annotations

import contextlib

from ...runtime import hf
from ..base import patched

# ------------------------------------------------------------------------------------------------
# a cache handed over under a keyword the model does not take
# ------------------------------------------------------------------------------------------------
# The regression the suite once missed: a loop hands its cache over as ``cache=`` to a transformers
# that only knows ``past_key_values`` (4.x), which takes it into ``**kwargs`` and drops it. Every step
# then runs without its history, fast and wrong, and nothing raises. These faults do the same on any
# release (the keyword is misspelled: ``caches=``), scoped to one loop, so that each loop's own
# evidence of cache use (cheapinfer.runtime.evidence) has to notice.


def misspelled_forward(model, input_ids=None, *, cache=None, **kwargs):
    """:func:`hf.forward` with the cache under a keyword no release takes (swallowed into ``**kwargs``)."""
    return hf.forward(model, input_ids, caches=cache, **kwargs)


MISSPELLED_HF = type("MisspelledHF", (), {**{k: staticmethod(v) if callable(v) else v for k, v in vars(hf).items() if not k.startswith("__")},
                                         "forward": staticmethod(misspelled_forward)})


def misspelled_while(module, fn, returns_callable: bool = False):
    """``fn`` whose model calls through ``module.hf`` misspell the cache keyword while it runs (or, with
    ``returns_callable``, while the callable it returns runs)."""
    import functools

    def scoped(g):
        @functools.wraps(g)
        def call(*args, **kwargs):
            with patched(module, "hf", MISSPELLED_HF):
                return g(*args, **kwargs)

        return call

    if not returns_callable:
        return scoped(fn)

    @functools.wraps(fn)
    def make(*args, **kwargs):
        return scoped(fn(*args, **kwargs))

    return make


@contextlib.contextmanager
def replaying_steps(module, name: str):
    """``module.name``, a factory of repeatable step callables, patched so that every step it builds replays its first result."""
    real = getattr(module, name)

    def replaying(*args, **kwargs):
        return replaying_first(real(*args, **kwargs))

    with patched(module, name, replaying):
        yield


def replaying_first(step):
    """``step`` run once; every later call returns that first result (a step cached by its arguments)."""
    done = []

    def once():
        if not done:
            done.append(step())
        return done[0]

    return once
