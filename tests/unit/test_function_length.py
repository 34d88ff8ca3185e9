"""No function in ``operators/`` is longer than a screen (60 lines): a longer one is split into named
steps, as the EndpointAttachment planner's stages are."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 60


def test_no_function_in_the_operators_is_over_sixty_lines() -> None:
    long: list[str] = []
    for path in sorted((ROOT / "operators").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    assert long == []
