"""Write the generated pages (``python -m hack.docgen``), or, with ``--check``, name the stale ones.

Decides: the set of generated files (``render``), which differ from what is on disk or are reference
pages nothing generates any more (``stale``), and writing them (``write``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hack.docgen.common import ROOT, splice
from hack.docgen.conditions import CONDITIONS_PAGE, render_conditions_section
from hack.docgen.constants import code_constants, undocumented
from hack.docgen.rbac import OPERATIONS_PAGE, RBAC_BEGIN, RBAC_END, load_rbac, render_rbac_section
from hack.docgen.reference import REFERENCE_DIR, load_crds, render_reference_index, render_reference_page
from hack.docgen.settings import SETTINGS_BEGIN, SETTINGS_END, render_settings_section
from hack.regenerate import check_or_write


def render(root: Path = ROOT) -> dict[Path, str]:
    """Every generated file (relative path -> full text)."""
    crds = load_crds(root)
    files: dict[Path, str] = {REFERENCE_DIR / "README.md": render_reference_index(crds)}
    for crd in crds:
        files[REFERENCE_DIR / crd.page] = render_reference_page(crd, root)
    conditions = root / CONDITIONS_PAGE
    if conditions.exists():
        section = render_conditions_section(code_constants(root))
        files[CONDITIONS_PAGE] = splice(conditions.read_text(encoding="utf-8"), section)
    operations = root / OPERATIONS_PAGE
    if operations.exists():
        page = splice(
            operations.read_text(encoding="utf-8"), render_settings_section(), SETTINGS_BEGIN, SETTINGS_END
        )
        files[OPERATIONS_PAGE] = splice(page, render_rbac_section(load_rbac(root)), RBAC_BEGIN, RBAC_END)
    return files


def stale(root: Path = ROOT) -> list[Path]:
    """Generated files that differ from what is on disk, and reference pages nothing generates."""
    files = render(root)
    out = [
        p
        for p, text in files.items()
        if not (root / p).exists() or (root / p).read_text(encoding="utf-8") != text
    ]
    reference = root / REFERENCE_DIR
    if reference.is_dir():
        out += [
            p.relative_to(root) for p in sorted(reference.glob("*.md")) if p.relative_to(root) not in files
        ]
    out += [page for page in (CONDITIONS_PAGE, OPERATIONS_PAGE) if not (root / page).exists()]
    return sorted(out)


def write(root: Path = ROOT) -> list[Path]:
    files = render(root)
    changed: list[Path] = []
    for path, text in files.items():
        target = root / path
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            changed.append(path)
    reference = root / REFERENCE_DIR
    for page in sorted(reference.glob("*.md")):
        if page.relative_to(root) not in files:
            page.unlink()
            changed.append(page.relative_to(root))
    return sorted(changed)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.docgen", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a generated file is stale")
    args = parser.parse_args(argv)
    constants = code_constants()
    for constant in undocumented(constants):
        print(
            f"warning: {constant.path}: {constant.name} = {constant.value!r} is not explained: declare "
            "it through its module's GUIDE (shared.reasons)",
            file=sys.stderr,
        )
    return check_or_write(args.check, stale, write, "python -m hack.docgen")
