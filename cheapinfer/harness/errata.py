"""The errata sections of the report (:func:`cheapinfer.harness.report.markdown`): confirmed errata with
their grades, candidate errata (claims that deviate), inconclusive measurements with their noise, and the
fault runs. Pure functions of a record.
"""

from __future__ import annotations

from typing import Any

from . import registry, tables
from .record import ALL_TARGETS, NOT_REACHED, RED
from .registry import DEVIATES, ERRATUM, INCONCLUSIVE
from .schema import ResultEntry, RunRecord

# ----------------------------------------------------------------------------------------------
# candidate errata
# ----------------------------------------------------------------------------------------------


def _conclusion(r: ResultEntry, failures: list[dict[str, Any]]) -> str:
    if any(f.get("stale") for f in failures):
        return (
            "A confirmed erratum no longer holds: the book's digits reproduce here. Either a library or the setup changed "
            "(compare with a run on the pinned versions), or the erratum was wrong: revise its registry entry."
        )
    if r.get("perturbed"):
        return (
            "The book's values were moved beyond their tolerance on purpose (`--perturb`): this entry shows "
            "that the check can fail. It is not an erratum."
        )
    if any(f["kind"] == "digits" for f in failures):
        measured = "; ".join(f"{f['q']} = {tables.value_text(f['measured'])}" for f in failures if f["kind"] == "digits")
        return (
            f"The book's number does not hold on the {r['profile']} profile, where its digits are expected. "
            f"If the environment below matches the book's setup, the sentence is a candidate erratum and should give "
            f"the measured value ({measured}). If a library changed since the pinned versions, compare with a run on "
            "the pinned versions (`python -m cheapinfer compare`) before filing it."
        )
    return (
        f"The chapter's qualitative conclusion does not hold on the {r['profile']} profile ({r['device']}). Either the "
        "claim does not carry over to this model or device (the book should say where it holds), or a library update "
        "changed the behaviour: compare with a run on the pinned versions (`python -m cheapinfer compare`)."
    )


def candidate_errata(record: RunRecord) -> list[dict[str, Any]]:
    """One entry per result with a failed asserted check: what was measured, how, what a reader should conclude.

    Results deviating because their book values were perturbed on purpose come last.
    """
    out = []
    for cid, c in record["claims"].items():
        for r in c["results"]:
            if r["verdict"] != DEVIATES:
                continue  # a confirmed erratum is listed under "Errata", with its evidence
            failures = [
                {**{k: chk[k] for k in ("q", "kind", "measured", "expected", "why")}, "stale": bool(chk.get("documented"))}
                for chk in r.get("checks", [])
                if chk["asserted"] and (not chk["passed"]) != bool(chk.get("documented"))
            ]
            if failures:
                out.append(
                    {
                        "claim": cid,
                        "profile": r["profile"],
                        "device": r["device"],
                        "test": r.get("test", ""),
                        "perturbed": bool(r.get("perturbed")),
                        "failures": failures,
                        "notes": list(r.get("notes", [])),
                        "conclusion": _conclusion(r, failures),
                    }
                )
    return sorted(out, key=lambda e: e["perturbed"])


def confirmed_errata(record: RunRecord) -> list[tuple[str, dict[str, Any], dict[str, Any], list[dict[str, Any]]]]:
    """(claim ID, claim, erratum, results) for every documented erratum that held in this run: the results
    with verdict erratum on one of its profiles, where a check it documents failed as documented."""
    out = []
    for cid, c in record["claims"].items():
        for e in registry.recorded_errata(c):
            rs = [r for r in c.get("results", []) if r["verdict"] == ERRATUM and r["profile"] in e["profiles"]
                  and any(chk.get("documented") and chk["q"] in e["fails"] for chk in r.get("checks", []))]
            if rs:
                out.append((cid, c, e, rs))
    return out


def confirmed_lines(record: RunRecord) -> list[str]:
    found = confirmed_errata(record)
    if not found:
        return []
    lines = [
        "## Errata",
        "",
        "Confirmed errata: the registry documents each one, the suite measured it again in this run, and the book's "
        "digits failed exactly as documented. They keep CI green; the day the digits reproduce, the claim turns red. "
        "Each has a grade: " + "; ".join(f"*{g}*, {d}" for g, d in registry.GRADES.items()) + ".",
        "",
        "| grade | errata |",
        "|---|---|",
        *(f"| {g} | {sum(1 for _, _, e, _ in found if e.get('grade', 'erratum') == g)} |" for g in registry.GRADES),
        "",
    ]
    for cid, c, e, rs in found:
        units = c.get("units", {})
        lines += [f"### {cid} ({e.get('grade', 'erratum')})", "", f"> {c['statement']}", ""]
        stands = "; ".join(f"`{k}` = {tables.with_unit(c['book'][k], units.get(k))} ({tables.printed_text(c, k) or 'no source'})" for k in e["stands_on"])
        lines.append(f"- **The book says:** {e['says']} It stands on: {stands}.")
        lines.append(f"- **What holds instead:** {e['holds']}")
        lines.append(f"- **Under which assumption the book's number would hold:** {e['assumption']}")
        if e.get("reader"):
            lines.append(f"- **For readers:** {e['reader']}")
        if e.get("applies"):
            env = record.get("environment", {})
            on = ", ".join(f"{lib} {spec} (this run: {env.get(lib, '?')})" for lib, spec in e["applies"].items())
            lines.append(f"- **Holds on:** {on}; on other releases the book's digits are asserted.")
        for r in rs:
            for chk in r.get("checks", []):
                if chk.get("documented") and chk["q"] in e["fails"]:
                    lines.append(f"- **Evidence** ({r['profile']}, {r['device']}): `{chk['q']}` measured {tables.value_text(chk['measured'])}, the book's `{chk['expected']}` fails ({chk['why']}).")
            others = [f"`{chk['q']}` {tables.value_text(chk['measured'])}" for chk in r.get("checks", []) if not chk.get("documented") and chk["asserted"]]
            if others:
                lines.append(f"- **Still holds** ({r['profile']}): " + "; ".join(others) + ".")
            if r.get("test"):
                lines.append(f"- **Test:** `{r['test']}`")
        lines.append("")
    return lines


def _load_text(load: dict[str, Any] | None) -> str:
    if not load:
        return "not recorded"
    avg = lambda v: "/".join(f"{x:g}" for x in v) if v else "?"  # noqa: E731
    steal = load.get("steal_fraction")
    return (f"load average {avg(load.get('loadavg_before'))} before, {avg(load.get('loadavg_after'))} after, on {load.get('cpus', '?')} CPUs; "
            f"CPU steal {'?' if steal is None else f'{steal:.1%}'}")


def inconclusive_lines(record: RunRecord) -> list[str]:
    """Results the measurement could not decide: each undecided check with its numbers, the load, and what to do.

    Not candidate errata: the noise or the range, not the book, decided nothing."""
    rows = [(cid, r) for cid, c in record["claims"].items() for r in c.get("results", []) if r["verdict"] == INCONCLUSIVE]
    if not rows:
        return []
    lines = ["## Inconclusive", "",
             "Measurements that could not decide. No candidate errata: a margin within the measurement's noise, a "
             "search that ran out of range, or a device that cannot measure the claim's premise says nothing about the book.", ""]
    for cid, r in rows:
        lines += [f"### {cid} on {r['profile']} ({r['device']})", ""]
        for chk in r.get("checks", []):
            if chk.get("decided") is not False:
                continue
            if chk.get("measurable"):
                why = r.get("measured", {}).get(f"{chk['q']}_why") or "see the measured values"
                lines.append(f"- `{chk['q']}`: this device cannot measure it: {why}. **To do:** measure on a device where it can.")
            elif chk.get("searched"):
                ranges = "; ".join(f"`{k}` = {tables.value_text(v)}" for k, v in r.get("measured", {}).items() if "searched" in k) or "see the measured values"
                lines.append(f"- `{chk['q']}`: not found in the range this device could afford ({ranges}). **To do:** search further "
                             "on a device with more memory or time.")
            else:
                se, m, bound = chk.get("se"), chk.get("measured"), chk.get("bound")
                numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (se, m, bound))
                margin = registry.margin_text(abs(m - bound) / se) if numbers and se else "?"
                lines.append(f"- `{chk['q']}`: measured {tables.value_text(m)} ± {tables.value_text(se)} ({tables.noise_words(chk)}); expected "
                             f"`{chk['expected']}`: the margin is {margin} standard errors, fewer than the {tables.value_text(chk.get('sigmas'))} needed "
                             "to decide. **To do:** run on a quieter machine, or with more rounds.")
        lines.append(f"- **Load:** {_load_text(r.get('load'))}.")
        if r.get("test"):
            lines.append(f"- **Test:** `{r['test']}`")
        lines.append("")
    return lines


def fault_lines(record: RunRecord) -> list[str]:
    claims = record["claims"]
    tested = [cid for cid, c in claims.items() if c.get("has_test")]
    if not any(c.get("faults") for c in claims.values()):
        return []
    lines = ["## Fault coverage", "",
             "Each known fault breaks the measured system (not the registry) the way a real bug would; the claims it names "
             "must turn red (`python -m cheapinfer faults`).", ""]
    last = record.get("fault_run")
    rows = []
    for cid in tested:
        names = claims[cid].get("faults", [])
        if not names:
            continue
        seen = []
        for n in names:
            f = (last or {}).get("faults", {}).get(n)
            if f:
                red = sum(run.get(cid) == RED for run in f["runs"])
                skipped = sum(str(run.get(cid, "")).startswith(NOT_REACHED) for run in f["runs"])
                seen.append(f"{n} (red {red}/{len(f['runs'])}" + (f", not reached in {skipped}: caught first by another claim" if skipped else "") + ")")
            else:
                seen.append(f"{n} (not run)")
        rows.append([cid, "; ".join(seen)])
    lines += tables.markdown_table(["claim", "faults that turn it red (last faults run)"], rows)
    lines.append("")
    bare = [cid for cid in tested if not claims[cid].get("faults")]
    lines.append("Claims that no known fault turns red: " + (", ".join(bare) if bare else "none") + ".")
    if last:
        mode = last.get("mode", ALL_TARGETS)  # a record from before the sweep ran every target
        how = ("every claim each fault names was run" if mode == ALL_TARGETS
               else "the sweep: each run of a fault stopped at its first red claim, unclocked claims first")
        caught = sum(f.get("caught") == last.get("runs") for f in last.get("faults", {}).values())
        lines.append(f"Last faults run: {last.get('created', '?')}, {last.get('runs', '?')} run(s) of each of {len(last.get('faults', {}))} faults "
                     f"({how}); {caught} caught in every run.")
    lines.append("")
    return lines


def errata_lines(record: RunRecord) -> list[str]:
    errata = candidate_errata(record)
    if not errata:
        return []
    lines = ["## Candidate errata", ""]
    for e in errata:
        c = record["claims"][e["claim"]]
        title = f"### {e['claim']} on {e['profile']} ({e['device']})" + (" — perturbed on purpose" if e["perturbed"] else "")
        lines += [title, "", f"> {c['statement']}", ""]
        for f in e["failures"]:
            if f.get("stale"):
                lines.append(f"- **Measured:** `{f['q']}` = {tables.value_text(f['measured'])} now meets `{f['expected']}`, which the registry documents as an erratum.")
            else:
                lines.append(f"- **Measured:** `{f['q']}` = {tables.value_text(f['measured'])}; the claim is `{f['expected']}` ({f['why']}).")
        how = f"- **How:** on the {e['profile']} profile, {e['device']}"
        lines.append(how + (f", by `{e['test']}`." if e["test"] else "."))
        for note in e["notes"]:
            lines.append(f"- **Note:** {note}")
        lines.append(f"- **Conclusion:** {e['conclusion']}")
        lines.append("")
    return lines
