"""The code's named constants and their declarations: the inventory and the checks on it.

Decides: which module-level string constants are condition types, condition reasons and Event
reasons (``COND_*``/``CONDITION_*``, ``REASON_*``, ``EVENT_*`` in ``operators/`` and ``shared/``,
read from the source with ``ast``), the declarations each kind's ``reasons`` module makes through
its ``GUIDE`` (``shared.reasons``, imported), and which constants no declaration explains
(``undocumented``) or which declarations no constant holds (``unused_guide_entries``).
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from hack.docgen.common import ROOT
from shared.reasons import ConditionType, EventReason, Guide, Reason

# Where named constants (condition types, reasons, event reasons) are looked for.
CONSTANT_ROOTS: Final = (Path("operators"), Path("shared"))
# Event types are constants too (EVENT_NORMAL, EVENT_WARNING), but they are not reasons.
EVENT_TYPES: Final = frozenset({"Normal", "Warning"})
# The methods of ``shared.reasons.Guide`` that declare a constant (and return its value).
GUIDE_DECLARATIONS: Final = frozenset({"condition", "reason", "event"})
# The kinds that report conditions, in the order the page lists them, with the module that declares
# their condition types, reasons and Event reasons (``shared.reasons``); a constant is looked up in
# the module's package first.
KIND_MODULES: Final = {
    "GPUClass": "operators.gpuclass.reasons",
    "EndpointAttachment": "operators.endpointattachment.reasons",
}
KIND_SOURCES: Final = {
    kind: module.rsplit(".", 1)[0].replace(".", "/") for kind, module in KIND_MODULES.items()
}


def guides() -> list[Guide]:
    """Each kind's declarations, in the order of ``KIND_MODULES``."""
    found: list[Guide] = []
    for kind, name in KIND_MODULES.items():
        guide = getattr(importlib.import_module(name), "GUIDE", None)
        if not isinstance(guide, Guide) or guide.kind != kind:
            raise TypeError(f"{name} declares no GUIDE = Guide({kind!r})")
        found.append(guide)
    return found


def condition_types() -> list[ConditionType]:
    return [t for guide in guides() for t in guide.condition_types]


def reasons() -> list[Reason]:
    return [r for guide in guides() for r in guide.reasons]


def events() -> list[EventReason]:
    return [e for guide in guides() for e in guide.events]


@dataclass(frozen=True)
class Constant:
    path: str  # relative to the repository, POSIX
    name: str
    value: str
    literal: bool  # False when assigned from another constant (an alias)

    @property
    def category(self) -> str | None:
        if self.name.startswith("REASON_"):
            return "reason"
        if self.name.startswith(("COND_", "CONDITION_")):
            return "type"
        if self.name.startswith("EVENT_") and self.value not in EVENT_TYPES:
            return "event"
        return None


def _python_files(root: Path) -> list[Path]:
    files: list[Path] = []
    for base in CONSTANT_ROOTS:
        directory = root / base
        if directory.is_dir():
            files.extend(p for p in directory.rglob("*.py") if "__pycache__" not in p.parts)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _assignments(tree: ast.Module) -> Iterator[tuple[str, ast.expr]]:
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            yield node.target.id, _declared(node.value)
        elif (
            isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        ):
            yield node.targets[0].id, _declared(node.value)


def _declared(value: ast.expr) -> ast.expr:
    """The value a ``Guide`` declaration (``GUIDE.reason("X", ...)``) returns: its first argument."""
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr in GUIDE_DECLARATIONS
        and value.args
    ):
        return value.args[0]
    return value


def code_constants(root: Path = ROOT) -> list[Constant]:
    """Every module-level string constant named ``REASON_*``, ``COND_*``/``CONDITION_*`` or ``EVENT_*``.

    An alias (``REASON_X: Final = REASON_Y``) is resolved in its module, then among every module's
    literals by name (imports are named the same as where they are defined).
    """
    literals: dict[str, str] = {}
    pending: list[tuple[str, str, str]] = []  # (path, name, aliased name)
    found: list[Constant] = []
    for file in _python_files(root):
        rel = file.relative_to(root).as_posix()
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=rel)
        local: dict[str, str] = {}
        for name, value in _assignments(tree):
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                local[name] = value.value
                found.append(Constant(rel, name, value.value, literal=True))
            elif isinstance(value, ast.Name):
                if value.id in local:
                    found.append(Constant(rel, name, local[value.id], literal=False))
                else:
                    pending.append((rel, name, value.id))
        for name, value_text in local.items():
            literals.setdefault(name, value_text)
    for rel, name, aliased in pending:
        if aliased in literals:
            found.append(Constant(rel, name, literals[aliased], literal=False))
    return sorted((c for c in found if c.category), key=lambda c: (c.path, c.name))


def undocumented(constants: Sequence[Constant]) -> list[Constant]:
    """Constants whose value no declaration explains (a reason assigned a bare string, not declared
    through its module's ``GUIDE``)."""
    known = {
        "reason": {r.name for r in reasons()},
        "type": {t.type for t in condition_types()},
        "event": {e.name for e in events()},
    }
    return [c for c in constants if c.category and c.value not in known[c.category]]


def unused_guide_entries(constants: Sequence[Constant]) -> list[str]:
    """Declarations whose reason, type or event reason no named constant in the code holds."""
    values = {cat: {c.value for c in constants if c.category == cat} for cat in ("reason", "type", "event")}
    stale = [f"reason {r.kind}/{r.condition}/{r.name}" for r in reasons() if r.name not in values["reason"]]
    stale += [f"type {t.kind}/{t.type}" for t in condition_types() if t.type not in values["type"]]
    stale += [f"event {e.kind}/{e.name}" for e in events() if e.name not in values["event"]]
    return stale
