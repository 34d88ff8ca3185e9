"""DeviceClass selectors: Kubernetes' CEL expressions over one device, compiled once, evaluated here.

Decides:

* how a device of a ``ResourceSlice`` looks to a selector, as the DRA scheduler plugin shows it:
  ``device.driver``; ``device.attributes[domain][id]`` (an unqualified attribute name is in the
  driver's domain); ``device.capacity[domain][id]``; ``device.allowMultipleAllocations``.
  Attribute values are the CEL ``int``, ``bool`` or ``string`` they hold; a ``version`` attribute
  and every capacity are values of Kubernetes' own CEL types (semver, quantity), shown here as
  tagged strings (``VERSION_TAG``, ``QUANTITY_TAG`` and the exact value), so that two of them
  compare equal exactly when their values are equal;
* the functions of Kubernetes' CEL libraries a DeviceClass uses on those values, registered as
  custom functions of the maintained CEL implementation (``common-expression-language``, Rust's
  ``cel`` crate): ``quantity(text)``, ``semver(text)``, and, as receiver calls on either,
  ``compareTo``, ``isLessThan``, ``isGreaterThan``; on a quantity ``asInteger``,
  ``asApproximateFloat``, ``isInteger``, ``sign``; ``isQuantity``/``isSemver``;
* ``Selector``: one DeviceClass version's selectors, compiled once; a device is selected when every
  expression is ``true``. An expression that fails to compile selects nothing (and ``error`` says
  why); one that fails on a device (a missing domain, a type error) does not select that device.

Deliberately differs from the scheduler: where the scheduler meets a runtime error of a selector on
some device, it fails the claim's whole allocation attempt; here only that device is not counted
(a class whose selector errors on every device counts 0, which is what the tenant then gets). A
version attribute compared with ``==`` against a plain string is ``false`` here, where Kubernetes'
type check refuses the expression. Kubernetes' other CEL libraries (string extensions such as
``lowerAscii``, lists, sets, IP and CIDR) are not registered: a selector calling one errs on every
device, so its class selects nothing. Cost limits are not applied (the API server applied them
when the DeviceClass was written).

Does not: read a ResourceSlice (``dra`` does), or keep any state between calls but the compiled
programs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

import cel

from operators.gpuclass.quantity import Exact, parse_exact

log = logging.getLogger(__name__)

# Kubernetes' quantity and semver are CEL types of their own; here they are strings with a tag, the
# exact value after it, so equal values are equal strings and other strings never look like them.
QUANTITY_TAG: Final = "\x00quantity:"
VERSION_TAG: Final = "\x00semver:"
# The name of the one variable a DeviceClass selector sees.
DEVICE_VARIABLE: Final = "device"
# Semantic versions as Kubernetes' semver library reads them (major.minor.patch, pre-release, build).
_SEMVER: Final = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z.-]+)?$"
)


class CelValueError(ValueError):
    """A custom function met a value it does not take (the device is then not selected)."""


def quantity_value(text: object) -> str | None:
    """A capacity or ``quantity()`` argument as the tagged exact value; ``None`` if not a quantity."""
    exact = parse_exact(text)
    return None if exact is None else f"{QUANTITY_TAG}{exact}"


def version_value(text: object) -> str | None:
    """A version attribute or ``semver()`` argument as the tagged value; ``None`` if not semver."""
    if not isinstance(text, str) or _SEMVER.match(text) is None:
        return None
    return f"{VERSION_TAG}{text.split('+', 1)[0]}"


def device_variable(
    driver: str, attributes: Mapping[str, Mapping[str, object]], capacity: Mapping[str, Mapping[str, str]]
) -> dict[str, Any]:
    """What a selector sees as ``device`` (values already converted, see the module docstring)."""
    return {
        "driver": driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": False,
    }


class DeviceContext:
    """One device converted into CEL values once, for every selector that judges it."""

    __slots__ = ("context",)

    def __init__(self, device: Mapping[str, Any]) -> None:
        self.context = cel.Context(variables={DEVICE_VARIABLE: device}, functions=_FUNCTIONS)


def device_context(device: Mapping[str, Any]) -> DeviceContext:
    return DeviceContext(device)


@dataclass(frozen=True)
class Selector:
    """The selectors of one DeviceClass version, compiled once."""

    programs: tuple[Any, ...]  # cel.Program each; empty: every device of every driver
    error: str = ""  # why the class selects nothing (a selector that did not compile)

    @classmethod
    def compile(cls, expressions: Sequence[str]) -> Selector:
        programs = []
        for expression in expressions:
            try:
                programs.append(cel.compile(expression))
            except Exception as error:  # the library raises its own and ValueError/RuntimeError
                return cls((), f"selector {expression!r} does not compile: {error}")
        return cls(tuple(programs))

    def selects(self, device: Mapping[str, Any] | DeviceContext) -> bool:
        """Whether every selector holds for ``device`` (a ``device_context`` when several selectors
        judge one device: converting the device into CEL values costs ~20 times an evaluation)."""
        if self.error:
            return False
        if not self.programs:
            return True
        context = device if isinstance(device, DeviceContext) else device_context(device)
        for program in self.programs:
            try:
                if program.execute(context.context) is not True:
                    return False
            except Exception:  # a runtime error on this device: not selected (see the docstring)
                return False
        return True


# --- Kubernetes' quantity and semver libraries, as custom functions --------------------------------


def _quantity(text: object) -> str:
    value = quantity_value(text)
    if value is None:
        raise CelValueError(f"quantity({text!r}): not a quantity")
    return value


def _semver(text: object) -> str:
    value = version_value(text)
    if value is None:
        raise CelValueError(f"semver({text!r}): not a semantic version")
    return value


def _exact(value: object) -> Exact:
    """The exact value of a tagged quantity (``str`` of an int, or of a ``Fraction``)."""
    if isinstance(value, str) and value.startswith(QUANTITY_TAG):
        text = value[len(QUANTITY_TAG) :]
        try:
            return Fraction(text) if "/" in text else int(text)
        except ValueError:
            pass
    raise CelValueError(f"{value!r} is not a quantity")


def _version(value: object) -> tuple[tuple[int, int, int], tuple[tuple[int, int | str], ...] | None]:
    if isinstance(value, str) and value.startswith(VERSION_TAG):
        match = _SEMVER.match(value[len(VERSION_TAG) :])
        if match is not None:
            core = (int(match[1]), int(match[2]), int(match[3]))
            pre = (
                tuple((0, int(p)) if p.isdigit() else (1, p) for p in match[4].split("."))
                if match[4]
                else None
            )
            return core, pre
    raise CelValueError(f"{value!r} is not a semantic version")


def _compare(a: object, b: object) -> int:
    if isinstance(a, str) and a.startswith(VERSION_TAG):
        (core_a, pre_a), (core_b, pre_b) = _version(a), _version(b)
        if core_a != core_b:
            return -1 if core_a < core_b else 1
        if pre_a == pre_b:
            return 0
        if pre_a is None or pre_b is None:  # a release is newer than its pre-releases
            return 1 if pre_a is None else -1
        return -1 if pre_a < pre_b else 1  # (0, int) sorts before (1, str): numbers first, as semver
    x, y = _exact(a), _exact(b)
    return (x > y) - (x < y)


def _sign(value: object) -> int:
    exact = _exact(value)
    return (exact > 0) - (exact < 0)


_FUNCTIONS: Final[dict[str, Callable[..., Any]]] = {
    "quantity": _quantity,
    "semver": _semver,
    "isQuantity": lambda text: quantity_value(text) is not None,
    "isSemver": lambda text: version_value(text) is not None,
    "compareTo": _compare,
    "isLessThan": lambda a, b: _compare(a, b) < 0,
    "isGreaterThan": lambda a, b: _compare(a, b) > 0,
    "asInteger": lambda value: int(_exact(value)),
    "asApproximateFloat": lambda value: float(_exact(value)),
    "isInteger": lambda value: Fraction(_exact(value)).denominator == 1,
    "sign": _sign,
}
