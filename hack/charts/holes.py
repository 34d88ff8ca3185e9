"""Writing a manifest with holes: YAML whose marked places are Helm template actions.

Decides: how each kind of hole is written (``Hole``), how a string reaches Helm as text (``escape``:
config/'s own ``{{``/``}}``) and which strings are written as literal blocks. Does not: decide where
a hole goes (``hack.charts.templates`` does).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import yaml

RELEASE_NAMESPACE: Final = "{{ .Release.Namespace }}"
# A Go template opening or closing in config/'s text (Prometheus' alert templates): Helm must emit
# it as text, not run it.
GO_TEMPLATE_BRACES: Final = re.compile(r"\{\{|\}\}")
ESCAPED_BRACES: Final = {"{{": '{{ "{{" }}', "}}": '{{ "}}" }}'}
HOLE_TOKEN: Final = "__HOLE_{}__"
HOLE_LINE: Final = re.compile(
    r"^(?P<indent> *)(?P<dash>- )?(?:(?P<key>[\w.-]+): )?(?P<token>__HOLE_\d+__)(?P<null>: null)?$"
)
WIDTH: Final = 110
# A line of text longer than this, with quotes in it, is written folded.
FOLD_AT: Final = 60


@dataclass(frozen=True)
class Hole:
    """A template expression standing in a manifest; how it is written depends on its kind:
    ``scalar`` (``key: {{ expr }}``), ``block`` (``key:`` then ``toYaml expr``), ``optional`` (the
    whole ``key:`` only when ``expr`` is not empty; placed as a key), ``optional_scalar`` (the same,
    for a string) and ``splice`` (the items of ``expr`` spliced into the enclosing list or map)."""

    kind: str
    expr: str
    key: str = ""


class Literal(str):
    """A string always written as a literal block, so a template action in it stays on one line."""

    __slots__ = ()


class _Dumper(yaml.SafeDumper):
    holes: list[Hole]


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    """Several lines as a literal block; one long line with quotes in it folded (``>-``), as config/
    writes CEL, rather than quoted with its quotes doubled; any other as PyYAML would."""
    style = None
    if "\n" in text:
        style = "|" if not text.endswith((" ", "\n\n")) and "\t" not in text else None
    elif len(text) > FOLD_AT and ("'" in text or '"' in text):
        style = ">"
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


def _represent_literal(dumper: yaml.SafeDumper, text: Literal) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(text), style="|")


def _represent_hole(dumper: _Dumper, hole: Hole) -> yaml.ScalarNode:
    dumper.holes.append(hole)
    return dumper.represent_scalar("tag:yaml.org,2002:str", HOLE_TOKEN.format(len(dumper.holes) - 1))


_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(Literal, _represent_literal)
_Dumper.add_representer(Hole, _represent_hole)


def dump(doc: Any) -> str:
    """YAML of ``doc`` with each Hole written as its template text."""
    holes: list[Hole] = []

    class Dumper(_Dumper):
        pass

    Dumper.holes = holes
    text = yaml.dump(doc, Dumper=Dumper, sort_keys=False, width=WIDTH, default_flow_style=False)
    lines: list[str] = []
    for line in text.splitlines():
        match = HOLE_LINE.match(line)
        if not match:
            assert "__HOLE_" not in line, f"a hole where none may be: {line!r}"
            lines.append(line)
            continue
        hole = holes[int(match["token"][len("__HOLE_") : -2])]
        lines.extend(_fill(hole, match))
    # A value that is the release namespace alone needs no quotes (Helm writes a DNS label there).
    return "\n".join(lines).replace(f"'{RELEASE_NAMESPACE}'", RELEASE_NAMESPACE) + "\n"


def _fill(hole: Hole, match: re.Match[str]) -> list[str]:
    indent, dash, key = match["indent"], match["dash"] or "", match["key"]
    pad = len(indent) + len(dash)
    if hole.kind == "scalar":
        assert key, hole
        return [f"{indent}{dash}{key}: {{{{ {hole.expr} }}}}"]
    if hole.kind == "block":
        assert key, hole
        assert not dash, hole
        return [f"{indent}{key}:", f"{indent}  {{{{- toYaml {hole.expr} | nindent {pad + 2} }}}}"]
    assert (not key and not dash) or hole.kind == "splice", hole
    if hole.kind == "optional":
        assert match["null"], hole
        return _with(indent, hole.expr, f"{hole.key}:", f"  {{{{- toYaml . | nindent {pad + 2} }}}}")
    if hole.kind == "optional_scalar":
        assert match["null"], hole
        return _with(indent, hole.expr, f"{hole.key}: {{{{ . | quote }}}}")
    assert hole.kind == "splice", hole
    assert not key, hole
    return _with(indent, hole.expr, f"{{{{- toYaml . | nindent {len(indent)} }}}}")


def _with(indent: str, expr: str, *body: str) -> list[str]:
    """``body`` only when ``expr`` is not empty (``.`` is its value there)."""
    return [f"{indent}{{{{- with {expr} }}}}", *(indent + line for line in body), f"{indent}{{{{- end }}}}"]


def escape(text: str) -> str:
    return GO_TEMPLATE_BRACES.sub(lambda m: ESCAPED_BRACES[m.group()], text)
