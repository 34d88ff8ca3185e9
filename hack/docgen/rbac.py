"""The generated section of ``docs/hosters/operations.md``: every Role and ClusterRole in
``config/rbac/``, rule by rule with the comment that justifies it, and who is granted it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from hack.docgen.common import ROOT, code, leading_comment, table

OPERATIONS_PAGE: Final = Path("docs/hosters/operations.md")
RBAC_DIR: Final = Path("config/rbac")
RBAC_BEGIN: Final = (
    "<!-- BEGIN GENERATED RBAC by `python -m hack.docgen` from config/rbac: do not edit by hand -->"
)
RBAC_END: Final = "<!-- END GENERATED RBAC -->"


@dataclass(frozen=True)
class RbacObject:
    source: str
    comment: str  # the comment block that opens the object's document
    body: Mapping[str, Any]
    rule_comments: tuple[str, ...]  # the comment above each rule, in order ("" when none)


def _documents(text: str) -> list[str]:
    out: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.strip() == "---":
            out.append([])
        else:
            out[-1].append(line)
    return ["\n".join(lines) for lines in out]


def _rule_comments(document: str) -> tuple[str, ...]:
    """The comment lines right above each top-level ``- apiGroups`` entry under ``rules:``."""
    comments: list[str] = []
    pending: list[str] = []
    in_rules = False
    for line in document.splitlines():
        if line.startswith("rules:"):
            in_rules = True
            pending = []
            continue
        if not in_rules:
            continue
        if line.startswith("#"):
            pending.append(line.lstrip("#").strip())
        elif line.startswith("- "):
            comments.append(" ".join(pending))
            pending = []
        elif line and not line.startswith(" "):
            in_rules = False
    return tuple(comments)


def load_rbac(root: Path = ROOT) -> list[RbacObject]:
    found: list[RbacObject] = []
    for file in sorted((root / RBAC_DIR).rglob("*.yaml"), key=lambda p: p.relative_to(root).as_posix()):
        for document in _documents(file.read_text(encoding="utf-8")):
            body = yaml.safe_load(document)
            if not isinstance(body, dict) or not str(body.get("kind", "")).endswith(("Role", "RoleBinding")):
                continue
            found.append(
                RbacObject(
                    file.relative_to(root).as_posix(),
                    leading_comment(document, ""),
                    body,
                    _rule_comments(document),
                )
            )
    return found


def _subjects(binding: Mapping[str, Any]) -> str:
    out = []
    for subject in binding.get("subjects") or ():
        where = f" in `{subject['namespace']}`" if subject.get("namespace") else ""
        out.append(f"{subject.get('kind')} `{subject.get('name')}`{where}")
    return ", ".join(out) or "nobody"


def render_rbac_section(objects: Sequence[RbacObject]) -> str:
    out = [RBAC_BEGIN, ""]
    bindings = [o for o in objects if str(o.body.get("kind")).endswith("Binding")]
    for role in (o for o in objects if not str(o.body.get("kind")).endswith("Binding")):
        metadata = role.body.get("metadata") or {}
        name = str(metadata.get("name"))
        kind = str(role.body.get("kind"))
        where = f" in namespace `{metadata['namespace']}`" if metadata.get("namespace") else ""
        out += [f"#### {kind} `{name}`{where}", ""]
        facts = [f"From [`{role.source}`](../../{role.source})."]
        holders = [
            _subjects(b.body)
            for b in bindings
            if (b.body.get("roleRef") or {}).get("name") == name
            and (b.body.get("roleRef") or {}).get("kind") == kind
        ]
        if holders:
            facts.append("Granted to " + "; ".join(holders) + ".")
        labels = metadata.get("labels") or {}
        aggregated = sorted(
            k.removeprefix("rbac.authorization.k8s.io/aggregate-to-")
            for k, v in labels.items()
            if k.startswith("rbac.authorization.k8s.io/aggregate-to-") and str(v) == "true"
        )
        if aggregated:
            facts.append(
                "Aggregated into the built-in roles " + ", ".join(f"`{a}`" for a in aggregated) + "."
            )
        if role.comment:
            out += [role.comment, ""]
        out += [" ".join(facts), ""]
        rules = role.body.get("rules") or []
        rows = []
        for index, rule in enumerate(rules):
            groups = ", ".join(code(g) if g else "core" for g in rule.get("apiGroups") or ())
            resources = ", ".join(code(str(r)) for r in rule.get("resources") or ())
            names = rule.get("resourceNames")
            if names:
                resources += " (only " + ", ".join(code(str(n)) for n in names) + ")"
            verbs = ", ".join(str(v) for v in rule.get("verbs") or ())
            why = role.rule_comments[index] if index < len(role.rule_comments) else ""
            rows.append([groups, resources, verbs, why])
        header: tuple[str, ...] = ("API group", "Resources", "Verbs", "Why")
        if not any(row[-1] for row in rows):
            header, rows = header[:-1], [row[:-1] for row in rows]
        out += table(header, rows)
        out.append("")
    out.append(RBAC_END)
    return "\n".join(out)
