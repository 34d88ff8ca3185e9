"""The shape of a catalogue row: one bad input and the answer it must get.

Decides: what a row says (the object or update, the expected answer, what the refusal must read
like) and the three answers a bad input can get:

- ``Refused``: the API server refuses it at admission (the schema's types, ranges and CEL rules), with
  a message a person can act on: it contains ``says`` (a phrase written for a person), quotes no
  regular expression, echoes no huge value (the whole message stays under ``max_message``). A row
  may be an update (``update``: merge patch, JSON patch, server-side apply or replace) of an object
  created first; the stored object must then be left exactly as it was.
- ``Operated`` rows are accepted, and the operator answers (``expect``): ``conditioned``, with a named
  condition reason; or ``handled``, doing the right thing without a failure condition (a long name
  hashed to a valid Service name, a /8 pool counted, two overlapping classes never minting one
  address twice).

Does not: talk to a cluster (tests/integration/test_bad_input_catalogue.py runs the rows), or decide
the objects (the table modules beside this one do).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

Obj = dict[str, Any]

# How an update reaches the API server: the four ways a client can change an object.
Form = Literal["merge", "json", "apply", "replace"]
UPDATE_FORMS: Final[tuple[Form, ...]] = ("merge", "json", "apply", "replace")

# Placeholders the runner replaces with the namespaces it made for a group.
TENANT: Final = "{tenant}"
OTHER: Final = "{other}"

# Refusal messages are short: a few lines a person reads, never a quoted megabyte.
MAX_MESSAGE: Final = 1200
# What a message must never contain: a regular expression (ours or quoted by a format check).
REGEX_TELLS: Final = ("should match '", "^[", "]*", "regex used for validation")


@dataclass(frozen=True)
class Update:
    """A change to an object already stored: ``change`` is a JSON merge patch (None removes a key);
    the runner turns it into the ``form`` asked for."""

    form: Form
    change: Obj


@dataclass(frozen=True)
class Refused:
    """Refused at admission: creating ``obj`` (or, with ``update``, changing it once created)."""

    id: str
    obj: Obj
    says: str
    update: Update | None = None
    # Written through /status (as the operator would) after the create, before the update.
    status: Obj | None = None
    # The message is Kubernetes' own (object-name rules): it may quote the regex it checks with and
    # the name, which the API server bounds (253 characters). The phrase must still be there.
    kubernetes_message: bool = False
    max_message: int = MAX_MESSAGE
    answer: Literal["refused"] = "refused"


@dataclass(frozen=True)
class Expect:
    """The object the row is about, and what the operator must say on it: the condition ``type``
    (None: any condition) with ``status`` and ``reason``; and ``check``, a predicate on the object
    (and the cluster's view the runner passes) for what a condition cannot say."""

    kind: str
    name: str
    reason: str = ""
    status: str = "False"
    type: str | None = "Ready"
    namespace: str = TENANT
    check: Callable[[Obj, Mapping[str, Any]], bool] | None = None
    check_says: str = ""


@dataclass(frozen=True)
class Step:
    """One thing a row does to the cluster, in order: create an object, merge-patch one (its spec, or
    its status with ``subresource="status"``), ask for a merge patch that must be refused with
    ``says`` (``refuse``), delete one (and wait until it is gone; ``request-delete`` does not wait), or
    await an answer (``expect``) before going on."""

    op: Literal["create", "patch", "refuse", "delete", "request-delete", "await"]
    obj: Obj = field(default_factory=dict)
    subresource: str = ""
    expect: Expect | None = None
    says: str = ""


@dataclass(frozen=True)
class Operated:
    """Accepted; the operator answers (``Conditioned`` or ``Handled``, told by ``answer``)."""

    id: str
    group: str
    steps: Sequence[Step]
    expect: Expect
    answer: Literal["conditioned", "handled"] = "conditioned"
    # The behaviour is being built elsewhere: the row is expected to fail until it lands.
    xfail: str = ""


Row = Refused | Operated


def conditioned(id: str, group: str, steps: Sequence[Step], expect: Expect, **kw: Any) -> Operated:
    return Operated(id, group, tuple(steps), expect, "conditioned", **kw)


def handled(id: str, group: str, steps: Sequence[Step], expect: Expect, **kw: Any) -> Operated:
    return Operated(id, group, tuple(steps), expect, "handled", **kw)


def with_path(obj: Mapping[str, Any], dotted: str, value: Any) -> Obj:
    """A copy of ``obj`` with the value at ``dotted`` (``spec.address.className``; a ``[0]`` suffix
    indexes a list) replaced; ``DELETE`` removes the key."""
    copied = copy.deepcopy(dict(obj))
    *parents, last = dotted.split(".")
    node: Any = copied
    for part in parents:
        node = _step(node, part)
    name, index = _index(last)
    if index is None:
        if value is DELETE:
            node.pop(name, None)
        else:
            node[name] = value
    else:
        node[name][index] = value
    return copied


def _step(node: Any, part: str) -> Any:
    name, index = _index(part)
    child = node.setdefault(name, {} if index is None else [])
    return child if index is None else child[index]


def _index(part: str) -> tuple[str, int | None]:
    if part.endswith("]"):
        name, _, index = part[:-1].partition("[")
        return name, int(index)
    return part, None


class _Delete:
    def __repr__(self) -> str:
        return "DELETE"


DELETE: Final = _Delete()
