"""The generated section of ``docs/hosters/conditions.md`` (between ``BEGIN_MARKER`` and
``END_MARKER``): every condition type, condition reason and Event reason, each with what it means and
what to do, from its declaration beside its constant, and the constant that names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from hack.docgen.common import BEGIN_MARKER, END_MARKER, code, table
from hack.docgen.constants import KIND_SOURCES, Constant, condition_types, events, reasons, undocumented

CONDITIONS_PAGE: Final = Path("docs/hosters/conditions.md")


def _defined_in(constants: Sequence[Constant], kind: str, category: str, value: str) -> str:
    source = KIND_SOURCES.get(kind, "")
    named = [c for c in constants if c.category == category and c.value == value]
    matches = [c for c in named if c.literal] or named  # an Event named as a reason: its alias
    preferred = [c for c in matches if c.path.startswith(source)] or matches
    return ", ".join(f"`{c.name}`" for c in preferred[:2])


def _status_order(status: str) -> int:
    return {"True": 0, "Unknown": 1, "False": 2}.get(status, 3)


def render_conditions_section(constants: Sequence[Constant]) -> str:
    out = [BEGIN_MARKER, ""]
    sources = sorted({c.path for c in constants if c.category in ("reason", "type")})
    out += [
        "The tables below are generated from the named constants in "
        + ", ".join(f"[`{s}`](../../{s})" for s in sources)
        + "; a unit test fails when the code defines a reason this page does not explain.",
        "",
    ]
    declared = reasons()
    for kind in KIND_SOURCES:
        types = [t for t in condition_types() if t.kind == kind]
        out += [f'<a id="{kind.lower()}"></a>', "", f"### {kind}", ""]
        out += table(
            ("Condition type", "True means", "Constant"),
            ([code(t.type), t.true_means, _defined_in(constants, kind, "type", t.type)] for t in types),
        )
        out.append("")
        for condition_type in types:
            rows = sorted(
                (r for r in declared if r.kind == kind and r.condition == condition_type.type),
                key=lambda r: _status_order(r.status),
            )
            out += [f"#### {kind} `{condition_type.type}`", ""]
            out += table(
                ("Status", "Reason", "What it means", "What to do", "For", "Constant"),
                (
                    [
                        r.status,
                        code(r.name),
                        r.meaning,
                        r.remedy,
                        r.who,
                        _defined_in(constants, kind, "reason", r.name),
                    ]
                    for r in rows
                ),
            )
            out.append("")
    posted = sorted(events(), key=lambda e: (e.kind, e.type != "Warning", e.name))
    out += ['<a id="events"></a>', "", "### Events", ""]
    out += [
        "Posted on transitions only (never on every pass), as `events.k8s.io/v1` Events. GPU classes "
        "are cluster-scoped, so theirs go to `default`, the one namespace the API allows an Event "
        "about a cluster-scoped object besides `kube-system` (`kubectl describe gpuclass` lists "
        "them); an attachment's are in its namespace (`kubectl describe endpointattachment`). A "
        "repeat of an object's last Event of a reason, with the same note, within 10 minutes patches "
        "that Event's series (`(x3 over 4m)`), and one object spends at most 16 writes at once, one "
        "more every 5 minutes, however it flaps.",
        "",
    ]
    out += table(
        ("Kind", "Type", "Reason", "When", "What to do", "Constant"),
        (
            [
                e.kind,
                e.type,
                code(e.name),
                e.meaning,
                e.remedy,
                _defined_in(constants, e.kind, "event", e.name),
            ]
            for e in posted
        ),
    )
    out.append("")
    missing = undocumented(constants)
    if missing:
        out += ["### Not yet explained", ""]
        out += table(
            ("Constant", "Value", "Where"),
            ([code(c.name), code(c.value), code(c.path)] for c in missing),
        )
        out.append("")
    out.append(END_MARKER)
    return "\n".join(out)
