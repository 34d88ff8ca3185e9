"""The documentation in the repository is current and self-contained.

- the pages ``python -m hack.docgen`` writes (API reference, the reasons tables) match the CRDs and
  the code's named constants, and the guide explains every condition type, reason and Event reason
  the code defines (and nothing it no longer defines);
- every relative link in ``README.md`` and ``docs/`` resolves to a file or folder in the repository;
- nothing in the repository points at files outside it (the working notes it was designed from);
- the Python code blocks of the Markdown pages are formatted as ``ruff format`` would;
- the generator's own rules, one row per rule, on small schemas.
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack import docgen

ROOT = Path(__file__).resolve().parents[2]
# The working notes outside the repository; spelled in pieces so this file does not match itself.
OUTSIDE = ("/work" + "/shared", "shared" + "/design", "shared" + "/fixtures")
# A relative path climbing to a folder named "shared": fine when it lands inside the repository (a
# page under docs/ linking two levels up to the runtime package), never when it climbs out of it.
CLIMB_TO_SHARED = re.compile(r"((?:\.\./)+)shared\b")
# Markdown inline links and images, and reference definitions; targets without a scheme are local.
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
HTML_LINK = re.compile(r"<a\s[^>]*href=\"([^\"]+)\"")
FENCE = re.compile(r"^(\s*)(```|~~~)")
RUFF = Path(sys.executable).parent / "ruff"


def markdown_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def repository_files() -> list[Path]:
    """Tracked files plus new ones not ignored (pages written but not committed yet count too)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return [ROOT / name for name in sorted(set(listed.split("\0"))) if name and (ROOT / name).is_file()]


def prose(text: str) -> str:
    """The text with fenced code blocks and inline code blanked out (links there are not links)."""
    kept: list[str] = []
    fence: str | None = None
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(2)
            kept.append("")
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
            kept.append("")
        else:
            kept.append(re.sub(r"`+[^`]*`+", "", line))
    return "\n".join(kept)


def local_targets(text: str) -> list[str]:
    body = prose(text)
    found = INLINE_LINK.findall(body) + REFERENCE_LINK.findall(body) + HTML_LINK.findall(body)
    return [t for t in found if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, code) of every ```python block."""
    blocks: list[tuple[int, str]] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        if re.match(r"^```(python|py)\s*$", lines[index]):
            start = index + 1
            end = start
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            blocks.append((start + 1, "\n".join(lines[start:end]) + "\n"))
            index = end
        index += 1
    return blocks


# --- generated pages ----------------------------------------------------------------------------


def test_generated_pages_are_current() -> None:
    stale = docgen.stale(ROOT)
    assert not stale, f"stale generated docs {[str(p) for p in stale]}: run `python -m hack.docgen`"


def test_every_code_reason_is_explained() -> None:
    missing = docgen.undocumented(docgen.code_constants(ROOT))
    assert not missing, (
        "declare each through its kind's GUIDE (operators/<operator>/reasons.py), with what it means "
        "and what to do: " + ", ".join(f"{c.path}:{c.name}={c.value!r}" for c in missing)
    )


def test_guide_explains_nothing_the_code_no_longer_defines() -> None:
    assert docgen.unused_guide_entries(docgen.code_constants(ROOT)) == []


def test_every_crd_has_a_reference_page_in_the_index() -> None:
    index = (ROOT / docgen.REFERENCE_DIR / "README.md").read_text(encoding="utf-8")
    for crd in docgen.load_crds(ROOT):
        assert f"({crd.page})" in index
        assert (ROOT / docgen.REFERENCE_DIR / crd.page).is_file()


def test_generation_is_deterministic() -> None:
    assert docgen.render(ROOT) == docgen.render(ROOT)


@pytest.mark.parametrize("module", ["operators.gpuclass.settings", "operators.endpointattachment.settings"])
def test_every_flag_is_documented(
    module: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Wide enough that argparse never wraps a flag at its hyphen ("--vm-" / "datapath").
    monkeypatch.setenv("COLUMNS", "500")
    settings = importlib.import_module(module)
    with pytest.raises(SystemExit):
        settings.parse(["--help"])
    found = set(re.findall(r"(--[a-z][a-z0-9-]+)", capsys.readouterr().out)) - {"--help"}
    # argparse wraps the description at hyphens: "--vm-" at a line's end is "--vm-datapath" cut.
    flags = {
        flag for flag in found if not (flag.endswith("-") and any(o.startswith(flag) for o in found - {flag}))
    }
    page = (ROOT / "docs/hosters/operations.md").read_text(encoding="utf-8")
    missing = sorted(flag for flag in flags if f"`{flag}`" not in page)
    assert not missing, f"docs/hosters/operations.md does not describe {missing} of {module}"


# --- links and references -----------------------------------------------------------------------


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in local_targets(page.read_text(encoding="utf-8")):
        path = target.split("#", 1)[0].split("?", 1)[0]
        if not path:
            continue
        resolved = (ROOT / path.lstrip("/")) if path.startswith("/") else (page.parent / path)
        resolved = resolved.resolve()
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to what the repository does not hold: {broken}"


def test_nothing_points_outside_the_repository() -> None:
    offenders: list[str] = []
    for file in repository_files():
        data = file.read_bytes()
        if b"\0" in data:
            continue
        text = data.decode("utf-8", errors="replace")
        rel = file.relative_to(ROOT)
        for number, line in enumerate(text.splitlines(), 1):
            if any(marker in line for marker in OUTSIDE):
                offenders.append(f"{rel}:{number}")
            for climb in CLIMB_TO_SHARED.finditer(line):
                if not (file.parent / climb.group(0)).resolve().is_relative_to(ROOT):
                    offenders.append(f"{rel}:{number}")
    assert not offenders, f"references to files outside the repository: {offenders}"


@pytest.mark.skipif(not RUFF.exists(), reason="ruff is not installed beside this Python")
@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_are_formatted(page: Path) -> None:
    for line, code in python_blocks(page.read_text(encoding="utf-8")):
        done = subprocess.run(
            [str(RUFF), "format", "--stdin-filename", "block.py", "-"],
            cwd=ROOT,
            input=code,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, f"{page.relative_to(ROOT)}:{line}: {done.stderr}"
        assert done.stdout == code, f"{page.relative_to(ROOT)}:{line}: not as `ruff format` writes it"


# --- the generator's rules ------------------------------------------------------------------------


def section(schema: dict[str, Any], path: str, required: bool = False) -> str:
    return "\n".join(docgen._field_section(docgen.Field(path, schema, required)))


@pytest.mark.parametrize(
    ("schema", "required", "expected"),
    [
        ({"type": "string"}, True, "*string* · required"),
        ({"type": "integer", "format": "int64"}, False, "*integer (int64)*"),
        ({"type": "array", "items": {"type": "string"}}, False, "*[]string*"),
        ({"type": "object", "additionalProperties": {"type": "string"}}, False, "*map[string]string*"),
        ({"x-kubernetes-int-or-string": True}, False, "*int or string*"),
        ({"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf"}]}, False, "immutable"),
        ({"type": "string", "default": "Standard"}, False, "- Default: `Standard`"),
        ({"type": "string", "enum": ["", "A"]}, False, '- One of: `""`, `A`'),
        ({"type": "string", "pattern": "^a$"}, False, "- Pattern: `^a$`"),
        ({"type": "string", "maxLength": 63}, False, "- Maximum length: 63"),
        ({"type": "integer", "minimum": 1}, False, "- Minimum: 1"),
        ({"type": "array", "maxItems": 2, "items": {"type": "string"}}, False, "- Maximum items: 2"),
        (
            {"type": "array", "items": {"type": "string", "enum": ["IPv4"]}},
            False,
            "- Each item: One of: `IPv4`",
        ),
        (
            {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
            False,
            "one item per `type`",
        ),
        (
            {
                "type": "string",
                "x-kubernetes-validations": [{"rule": "size(self) > 1", "message": "too short"}],
            },
            False,
            "- Rule `size(self) > 1` — message: too short",
        ),
        (
            {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "fixed"}]},
            False,
            "- Rule (checked on update) `self == oldSelf` — message: fixed",
        ),
        (
            {"type": "object", "x-kubernetes-validations": [{"rule": "x", "messageExpression": "'a' + b"}]},
            False,
            "message expression: `'a' + b`",
        ),
        (
            {"type": "object", "x-kubernetes-validations": [{"rule": "x", "fieldPath": ".spec.a"}]},
            False,
            "reported at `.spec.a`",
        ),
        (
            {"type": "string", "x-kubernetes-validations": [{"rule": "a ||\n b", "message": "m"}]},
            False,
            "```cel\n  a ||\n   b\n  ```",
        ),
        ({"type": "string", "description": "Two\n  lines."}, False, "Two lines."),
    ],
)
def test_field_section(schema: dict[str, Any], required: bool, expected: str) -> None:
    assert expected in section(schema, "spec.x", required)


def test_fields_walk_in_schema_order_with_arrays_and_maps() -> None:
    schema = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "spec": {
                "type": "object",
                "required": ["b"],
                "properties": {
                    "b": {"type": "string"},
                    "a": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "x-kubernetes-validations": [{"rule": "true"}],
                            "properties": {"k": {"type": "string"}},
                        },
                    },
                    "m": {
                        "type": "object",
                        "additionalProperties": {"type": "object", "properties": {"v": {}}},
                    },
                },
            }
        },
    }
    walked = [(f.path, f.required) for f in docgen._fields(schema, "")]
    assert walked == [
        ("spec", True),
        ("spec.b", True),
        ("spec.a", False),
        ("spec.a[]", False),
        ("spec.a[].k", False),
        ("spec.m", False),
        ("spec.m.*.v", False),
    ]


def test_code_constants_resolve_aliases_and_skip_event_types(tmp_path: Path) -> None:
    package = tmp_path / "operators" / "x"
    package.mkdir(parents=True)
    (package / "reasons.py").write_text(
        "from typing import Final\n"
        'COND_READY: Final = "Ready"\n'
        'REASON_A: Final = "A"\n'
        "REASON_B: Final = REASON_A\n"
        'EVENT_WARNING: Final = "Warning"\n'
        'EVENT_GONE: Final = "Gone"\n'
        'OTHER: Final = "ignored"\n'
        "CONDITION_TYPES: Final = (COND_READY,)\n"
    )
    (package / "user.py").write_text("from operators.x.reasons import REASON_A\nREASON_C = REASON_A\n")
    found = {(c.name, c.value, c.category, c.literal) for c in docgen.code_constants(tmp_path)}
    assert found == {
        ("COND_READY", "Ready", "type", True),
        ("REASON_A", "A", "reason", True),
        ("REASON_B", "A", "reason", False),
        ("REASON_C", "A", "reason", False),
        ("EVENT_GONE", "Gone", "event", True),
    }


def test_splice_replaces_only_the_marked_section() -> None:
    page = f"intro\n{docgen.BEGIN_MARKER}\nold\n{docgen.END_MARKER}\noutro\n"
    section_text = f"{docgen.BEGIN_MARKER}\nnew\n{docgen.END_MARKER}"
    assert docgen.splice(page, section_text) == f"intro\n{section_text}\noutro\n"
    with pytest.raises(ValueError, match="markers"):
        docgen.splice("no markers", section_text)


def test_rbac_rules_keep_their_comments_and_holders() -> None:
    document = (
        "# The role.\n"
        "kind: ClusterRole\n"
        "metadata: {name: r, labels: {rbac.authorization.k8s.io/aggregate-to-view: 'true'}}\n"
        "rules:\n"
        "# Read pods,\n"
        "# for a reason.\n"
        "- apiGroups: ['']\n"
        "  resources: [pods]\n"
        "  verbs: [list]\n"
        "- apiGroups: [apps]\n"
        "  resources: [deployments]\n"
        "  resourceNames: [x]\n"
        "  verbs: [get]\n"
    )
    assert docgen._rule_comments(document) == ("Read pods, for a reason.", "")
    role = docgen.RbacObject("r.yaml", "The role.", yaml.safe_load(document), docgen._rule_comments(document))
    binding = {
        "kind": "ClusterRoleBinding",
        "roleRef": {"kind": "ClusterRole", "name": "r"},
        "subjects": [{"kind": "Group", "name": "system:authenticated"}],
    }
    text = docgen.render_rbac_section([role, docgen.RbacObject("b.yaml", "", binding, ())])
    assert "| core | `pods` | list | Read pods, for a reason. |" in text
    assert "| `apps` | `deployments` (only `x`) | get |  |" in text
    assert "Granted to Group `system:authenticated`." in text
    assert "Aggregated into the built-in roles `view`." in text


def test_links_in_code_are_not_links() -> None:
    text = "see [a](a.md) and `[b](b.md)`\n```md\n[c](c.md)\n```\n[d]: d.md\n[e](https://x.y) [f](#top)\n"
    assert local_targets(text) == ["a.md", "d.md"]
