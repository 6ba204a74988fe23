"""Counts the docs state, computed from the suite itself at build time, never typed by hand.

Each is a MyST substitution: ``{{ claims }}`` in a page is the number of claims in the registry, and so on.
tests/test_docs.py fails on a count typed in a page instead.
"""

from __future__ import annotations

from sphinx.application import Sphinx


def counts() -> dict[str, int]:
    """Every count a page may state, from the registry, the claim tests and the fault catalogue."""
    from cheapinfer.audits import matrix
    from cheapinfer.faults import catalogue, core  # noqa: F401  (importing the catalogue registers its faults)
    from cheapinfer.harness import registry
    from cheapinfer.runtime.profiles import device_dependent

    claims = registry.load()
    on_device = sum(device_dependent(c.runs_on) for c in claims.values())
    return {
        "claims": len(claims),
        "gpu_claims": on_device,
        "arithmetic_claims": len(claims) - on_device,
        "clocked_claims": len(registry.clocked_claims()),
        "slow_claims": len(registry.slow_claims()),
        "isa_claims": len(matrix.isa_claims()),
        "faults": len(core.FAULTS),
        "sections": len(registry.SECTIONS),
        "errata_claims": sum(bool(c.errata) for c in claims.values()),
    }


def texts() -> dict[str, str]:
    """Rules the pages quote, in the words the report prints them (never retyped on a page)."""
    from cheapinfer.faults.records import RECORD_FAULTS
    from cheapinfer.faults.text import TEXT_FAULTS
    from cheapinfer.harness import grades, locate

    entries = locate.entries()
    return {
        "text_faults": "\n".join(f"- *{f.check}*, `{name}`: {f.what}." for name, f in TEXT_FAULTS.items()),
        "record_faults": "\n".join(f"- *{f.check}*, `{name}`: {f.what}." for name, f in RECORD_FAULTS.items()),
        "grade_rule": "\n".join(f"{i}. *{grade}* ({basis}): {words}."
                                for i, (basis, grade, words) in enumerate(grades.GRADE_RULE, 1)),
        "round_word_rule": grades.ROUND_WORD_RULE,
        "errata_entries": str(len(entries)),
        "errata_places": str(sum(len(e.occurrences) for e in entries)),
    }


def _substitute(app: Sphinx, config) -> None:
    config.myst_substitutions = {**config.myst_substitutions, **{k: str(v) for k, v in counts().items()}, **texts()}


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", _substitute)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
