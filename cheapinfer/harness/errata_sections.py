"""The errata sections of the report (:func:`cheapinfer.harness.report.markdown`): confirmed errata with
their grades, candidate errata (claims that deviate), inconclusive measurements with their noise, and the
fault runs. Pure functions of a record.
"""

from __future__ import annotations

from typing import Any

from . import errata, tables
from .grades import GRADES
from .numbers import margin_text, value_text
from .schema import RunRecord
from .vocabulary import ALL_TARGETS, INCONCLUSIVE, NOT_REACHED, RED


def confirmed_lines(record: RunRecord) -> list[str]:
    found = errata.confirmed_errata(record)
    if not found:
        return []
    lines = [
        "## Errata",
        "",
        "Confirmed errata: the registry documents each one, the suite measured it again in this run, and the book's "
        "digits failed exactly as documented. They keep CI green; the day the digits reproduce, the claim turns red. "
        "Each has a grade: " + "; ".join(f"*{g}*, {d}" for g, d in GRADES.items()) + ".",
        "",
        "| grade | errata |",
        "|---|---|",
        *(f"| {g} | {sum(1 for _, _, e, _ in found if e.get('grade', 'erratum') == g)} |" for g in GRADES),
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
                    lines.append(f"- **Evidence** ({r['profile']}, {r['device']}): `{chk['q']}` measured {value_text(chk['measured'])}, the book's `{chk['expected']}` fails ({chk['why']}).")
            others = [f"`{chk['q']}` {value_text(chk['measured'])}" for chk in r.get("checks", []) if not chk.get("documented") and chk["asserted"]]
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
                ranges = "; ".join(f"`{k}` = {value_text(v)}" for k, v in r.get("measured", {}).items() if "searched" in k) or "see the measured values"
                lines.append(f"- `{chk['q']}`: not found in the range this device could afford ({ranges}). **To do:** search further "
                             "on a device with more memory or time.")
            else:
                se, m, bound = chk.get("se"), chk.get("measured"), chk.get("bound")
                numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (se, m, bound))
                margin = margin_text(abs(m - bound) / se) if numbers and se else "?"
                lines.append(f"- `{chk['q']}`: measured {value_text(m)} ± {value_text(se)} ({tables.noise_words(chk)}); expected "
                             f"`{chk['expected']}`: the margin is {margin} standard errors, fewer than the {value_text(chk.get('sigmas'))} needed "
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
    candidates = errata.candidate_errata(record)
    if not candidates:
        return []
    lines = ["## Candidate errata", ""]
    for e in candidates:
        c = record["claims"][e["claim"]]
        title = f"### {e['claim']} on {e['profile']} ({e['device']})" + (" — perturbed on purpose" if e["perturbed"] else "")
        lines += [title, "", f"> {c['statement']}", ""]
        for f in e["failures"]:
            if f.get("stale"):
                lines.append(f"- **Measured:** `{f['q']}` = {value_text(f['measured'])} now meets `{f['expected']}`, which the registry documents as an erratum.")
            else:
                lines.append(f"- **Measured:** `{f['q']}` = {value_text(f['measured'])}; the claim is `{f['expected']}` ({f['why']}).")
        how = f"- **How:** on the {e['profile']} profile, {e['device']}"
        lines.append(how + (f", by `{e['test']}`." if e["test"] else "."))
        for note in e["notes"]:
            lines.append(f"- **Note:** {note}")
        lines.append(f"- **Conclusion:** {e['conclusion']}")
        lines.append("")
    return lines
