"""Generate the hoster reference pages from the repository's own sources: ``python -m hack.docgen``.

Decides, one module per job:

* ``reference``: ``docs/hosters/reference/<kind>.md``, one page per CustomResourceDefinition found in
  ``config/crd/**/*.yaml``, and the index ``docs/hosters/reference/README.md``;
* ``conditions``: the generated section of ``docs/hosters/conditions.md`` (between the markers):
  every condition type, condition reason and Event reason the code defines as a named constant,
  each with what it means and what to do, from its declaration beside the constant (the kind's
  ``GUIDE`` in ``operators/<operator>/reasons.py``, records of ``shared.reasons``);
* ``constants``: the inventory of those named constants (``COND_*``/``CONDITION_*``, ``REASON_*``,
  ``EVENT_*`` in ``operators/`` and ``shared/``) and the checks that each is declared with its
  meaning (``undocumented``) and each declaration is held by a constant (``unused_guide_entries``);
* ``rbac``: the generated section of ``docs/hosters/operations.md``: every Role and ClusterRole in
  ``config/rbac/``, rule by rule with the comment that justifies it, and who is granted it;
* ``settings``: the settings tables of the same page: every flag, its environment variable, default
  and meaning, from the operators' settings fields (``shared.operator.setting``);
* ``cli``: writing them, or ``--check``: exit 1, naming the stale files, when anything on disk
  differs from what would be written. Output depends only on the files read and the declarations
  (sorted paths, the CRDs' own field order, the declarations' order), so two runs on the same tree
  write the same bytes;
* ``common``: what more than one job uses (the root, markers, ``splice``, Markdown helpers).

Does not: touch any hand-written page (only the marked sections of ``conditions.md`` and
``operations.md``), import any of the operators but their ``reasons`` and ``settings`` modules (the named
constants are read from the source with ``ast``), or decide whether every constant is declared with
its meaning: ``undocumented()`` and ``unused_guide_entries()`` say, and
``tests/unit/test_docs_current.py`` fails on either.
"""

from __future__ import annotations

from hack.docgen.cli import main, render, stale, write
from hack.docgen.common import BEGIN_MARKER, END_MARKER, ROOT, splice
from hack.docgen.conditions import CONDITIONS_PAGE, render_conditions_section
from hack.docgen.constants import Constant, code_constants, undocumented, unused_guide_entries
from hack.docgen.rbac import OPERATIONS_PAGE, RbacObject, _rule_comments, load_rbac, render_rbac_section
from hack.docgen.reference import (
    REFERENCE_DIR,
    Crd,
    Field,
    _field_section,
    _fields,
    load_crds,
    render_reference_index,
    render_reference_page,
)

__all__ = [
    "BEGIN_MARKER",
    "CONDITIONS_PAGE",
    "END_MARKER",
    "OPERATIONS_PAGE",
    "REFERENCE_DIR",
    "ROOT",
    "Constant",
    "Crd",
    "Field",
    "RbacObject",
    "_field_section",
    "_fields",
    "_rule_comments",
    "code_constants",
    "load_crds",
    "load_rbac",
    "main",
    "render",
    "render_conditions_section",
    "render_rbac_section",
    "render_reference_index",
    "render_reference_page",
    "splice",
    "stale",
    "undocumented",
    "unused_guide_entries",
    "write",
]
