"""The generated settings tables of ``docs/hosters/operations.md``: every flag of both operators, its
environment variable, its default and its meaning, read from the settings dataclasses' ``setting``
fields (``shared.operator``), so that adding a setting is one edit, in one file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import MISSING
from typing import Any, Final

from hack.docgen.common import code, table
from operators.endpointattachment import settings as endpointattachment
from operators.gpuclass import settings as gpuclass
from shared.operator import RuntimeSettings, setting_fields

SETTINGS_BEGIN: Final = (
    "<!-- BEGIN GENERATED SETTINGS by `python -m hack.docgen` from the settings fields: "
    "do not edit by hand -->"
)
SETTINGS_END: Final = "<!-- END GENERATED SETTINGS -->"
HEADER: Final = ("flag", "environment", "default", "meaning")
# Each operator's prefix, in the order the tables name them.
PREFIXES: Final = (gpuclass.ENV_PREFIX, endpointattachment.ENV_PREFIX)


def _default(value: Any) -> str:
    if value is None or value == "" or value is MISSING:
        return "—"
    if isinstance(value, bool):
        return code(str(value).lower())
    if isinstance(value, float) and value.is_integer():
        return code(str(int(value)))
    return code(value if isinstance(value, str) else json.dumps(value))


def _rows(cls: Any, prefixes: Sequence[str]) -> Iterable[list[str]]:
    for each, flag in setting_fields(cls):
        variables = [flag.variable] if flag.variable else [f"{p}_{each.name.upper()}" for p in prefixes]
        yield [
            code(f"--{each.name.replace('_', '-')}"),
            " / ".join(code(v) for v in variables),
            _default(each.default),
            flag.help,
        ]


def render_settings_section() -> str:
    """Three tables: the flags both operators have, then each operator's own."""
    out = [SETTINGS_BEGIN, "", "Both operators:", ""]
    out += table(HEADER, _rows(RuntimeSettings, PREFIXES))
    out += ["", "GPUClass operator only:", ""]
    out += table(HEADER, _rows(gpuclass.Settings, (gpuclass.ENV_PREFIX,)))
    out += ["", "EndpointAttachment operator only:", ""]
    out += table(HEADER, _rows(endpointattachment.Settings, (endpointattachment.ENV_PREFIX,)))
    return "\n".join([*out, "", SETTINGS_END])
