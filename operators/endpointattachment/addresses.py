"""Addresses: strict parsing, canonical text, allocation names, and the candidates of a class.

Decides:
- whether a text is an address we accept, and its one canonical spelling. Parsing is strict: only
  ``str``, ASCII, no surrounding or inner whitespace, no IPv6 zone id (``%eth0``), no IPv4 leading zeros
  (``010.0.0.1`` is octal to some tools and decimal to others), no IPv4-mapped IPv6 (``::ffff:a.b.c.d``
  would let one address hide under two families) and no dotted-quad tail in IPv6 text at all (Python
  versions disagree on its canonical spelling). Valid IPv6 spellings with upper case or leading zeros
  in a group are accepted and canonicalised (RFC 5952), because tenants copy them from many tools.
- the name of the IPAddressAllocation that locks an address: IPv4 as the dotted quad, IPv6 as ``v6-``
  plus 32 lowercase hex digits (colons are not allowed in object names); and the address back from a
  name, accepting only the exact name we would produce, so one address never has two lock names.
- the candidates of an IPAddressClass: ``cidrs`` and ``ranges`` (inclusive ``{start, end}``) merged,
  minus ``excludeAddresses``; one family per class. Implicit exclusions, for every listed CIDR (and so
  also when an overlapping range lists the address again): IPv4 network and broadcast addresses of
  prefixes shorter than /31 (a /31 and a /32 have none, RFC 3021); IPv6 all-zeros subnet-router
  anycast address (RFC 4291) of prefixes shorter than /127 (a /127 is a point-to-point link, RFC 6164,
  and a /128 a single address), as ``ipaddress``'s ``hosts()`` does. The RFC 2526 reserved anycast
  addresses at the top of an IPv6 /64 are not excluded: hosters exclude them explicitly if they care.
  Addresses listed only in ``ranges`` are taken as written.
- a lazy, deterministic iteration order over the candidates (ascending, wrapping), that never
  materialises the pool (a /64 is fine), with an optional starting offset: ``start_offset`` hashes the
  holder's UID into the pool, so concurrent minters for different holders start at different
  addresses and rarely race for the same lock name, while one holder always starts at the same place.
  The offset is only a hint; correctness comes from the allocation name being the lock.

Does not: talk to the API (the glue creates the allocation and retries on a 409 with that address
counted as taken), re-check an address already held against a class whose ranges later shrank (a
tenant's address is not yanked by a hoster's edit), or look at namespaces.
"""

from __future__ import annotations

import bisect
import hashlib
import ipaddress
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Final

from operators.endpointattachment.constants import (
    API_VERSION,
    IP_ADDRESS_ALLOCATION_KIND,
    IP_FAMILY_V4,
    IP_FAMILY_V6,
)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# IPv6 allocation names: a prefix that can never start an IPv4 dotted quad, then the 16 bytes in hex.
ALLOCATION_V6_PREFIX: Final = "v6-"
_V6_HEX_DIGITS: Final = 32
_LOWER_HEX: Final = frozenset("0123456789abcdef")


class InvalidAddress(ValueError):
    """A text that is not an address we accept (see the module docstring for the rules)."""


class InvalidPool(ValueError):
    """An IPAddressClass spec whose candidates cannot be computed (bad CIDR or range, mixed families)."""


def _check_text(text: object) -> str:
    if not isinstance(text, str) or not text:
        raise InvalidAddress(f"{text!r} is not a non-empty string")
    if not text.isascii() or any(ch.isspace() for ch in text):
        raise InvalidAddress(f"{text!r} contains whitespace or non-ASCII characters")
    if "%" in text:
        raise InvalidAddress(f"{text!r} carries a zone id")
    return text


def parse_address(text: object) -> IPAddress:
    """The address a text names, strictly (raises InvalidAddress)."""
    checked = _check_text(text)
    if ":" in checked and "." in checked:
        raise InvalidAddress(f"{checked!r} embeds an IPv4 dotted quad in IPv6 text")
    try:
        address = ipaddress.ip_address(checked)
    except ValueError as error:
        raise InvalidAddress(f"{checked!r} is not an IP address") from error
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        raise InvalidAddress(f"{checked!r} is an IPv4-mapped IPv6 address")
    return address


def canonical(text: object) -> str:
    """The one spelling we store for an address (raises InvalidAddress)."""
    return str(parse_address(text))


def is_canonical(text: object) -> bool:
    """Whether the text parses and is already its canonical spelling."""
    try:
        return canonical(text) == text
    except InvalidAddress:
        return False


def family_of(address: IPAddress) -> str:
    """The Kubernetes ipFamilies value of an address."""
    return IP_FAMILY_V4 if address.version == 4 else IP_FAMILY_V6


def allocation_name(address: IPAddress | str) -> str:
    """The IPAddressAllocation name that locks this address."""
    parsed = parse_address(address) if isinstance(address, str) else address
    if isinstance(parsed, ipaddress.IPv4Address):
        return str(parsed)
    return ALLOCATION_V6_PREFIX + parsed.packed.hex()


def address_from_allocation_name(name: str) -> IPAddress:
    """The address an allocation name locks; only names ``allocation_name`` produces are accepted."""
    if name.startswith(ALLOCATION_V6_PREFIX):
        digits = name[len(ALLOCATION_V6_PREFIX) :]
        if len(digits) != _V6_HEX_DIGITS or not set(digits) <= _LOWER_HEX:
            raise InvalidAddress(f"{name!r} is not v6- plus 32 lowercase hex digits")
        v6 = ipaddress.IPv6Address(bytes.fromhex(digits))
        if v6.ipv4_mapped is not None:
            raise InvalidAddress(f"{name!r} names an IPv4-mapped IPv6 address")
        return v6
    v4 = parse_address(name)
    if not isinstance(v4, ipaddress.IPv4Address) or str(v4) != name:
        raise InvalidAddress(f"{name!r} is not a canonical IPv4 allocation name")
    return v4


def parse_network(text: object) -> IPNetwork:
    """A CIDR, strictly: the address part follows ``parse_address``'s rules and host bits must be zero."""
    try:
        checked = _check_text(text)
    except InvalidAddress as error:
        raise InvalidPool(str(error)) from error
    base, slash, prefix = checked.partition("/")
    if not slash or not prefix.isdigit() or (len(prefix) > 1 and prefix.startswith("0")):
        raise InvalidPool(f"{checked!r} is not a CIDR")
    try:
        address = parse_address(base)
        return ipaddress.ip_network(f"{address}/{prefix}", strict=True)
    except ValueError as error:
        raise InvalidPool(f"{checked!r} is not a CIDR with zero host bits: {error}") from error


@dataclass(frozen=True)
class AddressPool:
    """The candidates of one class, as integer segments: never a materialised list of addresses."""

    version: int
    # Sorted, merged, inclusive [first, last] integer spans of the cidrs and ranges.
    segments: tuple[tuple[int, int], ...]
    # Excluded addresses that fall inside the segments (explicit and implicit), as integers.
    excluded: frozenset[int]

    @property
    def family(self) -> str:
        return IP_FAMILY_V4 if self.version == 4 else IP_FAMILY_V6

    @property
    def span(self) -> int:
        """Addresses in the segments, counting excluded ones (the range of ``candidates``' offsets)."""
        return sum(last - first + 1 for first, last in self.segments)

    @property
    def capacity(self) -> int:
        """How many addresses can ever be minted from this class."""
        return self.span - len(self.excluded)

    def contains(self, address: IPAddress) -> bool:
        """Whether the address is a candidate of this class."""
        value = int(address)
        return (
            address.version == self.version
            and _in_segments(self.segments, value)
            and value not in self.excluded
        )

    def candidates(self, start: int = 0) -> Iterator[IPAddress]:
        """Every candidate once, ascending from offset ``start`` (modulo the span), then wrapping."""
        span = self.span
        if span == 0:
            return
        offset = start % span
        make = ipaddress.IPv4Address if self.version == 4 else ipaddress.IPv6Address
        # The segment holding the offset, and where the offset falls inside it.
        index, inside = 0, offset
        while inside > self.segments[index][1] - self.segments[index][0]:
            inside -= self.segments[index][1] - self.segments[index][0] + 1
            index += 1
        count = len(self.segments)
        for step in range(count + 1):
            first, last = self.segments[(index + step) % count]
            if step == 0:
                low, high = first + inside, last
            elif step == count:
                low, high = first, first + inside - 1  # the wrapped head of the starting segment
            else:
                low, high = first, last
            for value in range(low, high + 1):
                if value not in self.excluded:
                    yield make(value)


def pool_of(spec: Mapping[str, Any]) -> AddressPool:
    """The candidates of an IPAddressClass ``spec`` (raises InvalidPool)."""
    spans: list[tuple[int, int]] = []
    implicit: set[int] = set()
    versions: set[int] = set()
    try:
        for text in _list(spec, "cidrs"):
            network = parse_network(text)
            versions.add(network.version)
            first, last = int(network.network_address), int(network.broadcast_address)
            spans.append((first, last))
            if network.version == 4 and network.prefixlen < 31:
                implicit.update((first, last))
            elif network.version == 6 and network.prefixlen < 127:
                implicit.add(first)
        for item in _list(spec, "ranges"):
            if not isinstance(item, Mapping):
                raise InvalidPool(f"range {item!r} is not an object with start and end")
            start, end = parse_address(item.get("start")), parse_address(item.get("end"))
            if start.version != end.version or int(start) > int(end):
                raise InvalidPool(f"range {start}-{end} is empty or mixes families")
            versions.add(start.version)
            spans.append((int(start), int(end)))
        explicit = [parse_address(text) for text in _list(spec, "excludeAddresses")]
    except InvalidAddress as error:
        raise InvalidPool(str(error)) from error
    versions.update(address.version for address in explicit)
    if len(versions) > 1:
        raise InvalidPool("a class holds one address family; cidrs, ranges and exclusions mix IPv4 and IPv6")
    segments = _merge(spans)
    excluded = frozenset(
        value for value in (*implicit, *(int(a) for a in explicit)) if _in_segments(segments, value)
    )
    return AddressPool(version=versions.pop() if versions else 4, segments=segments, excluded=excluded)


def start_offset(pool: AddressPool, holder_uid: str) -> int:
    """Where a holder's candidate walk starts: a hash of its UID into the pool's span (0 if empty)."""
    span = pool.span
    if span == 0:
        return 0
    digest = hashlib.sha256(holder_uid.encode()).digest()
    return int.from_bytes(digest[:16], "big") % span


def first_free(candidates: Iterable[IPAddress], taken: AbstractSet[str]) -> IPAddress | None:
    """The first candidate whose canonical text is not in ``taken``; None when all are."""
    for address in candidates:
        if str(address) not in taken:
            return address
    return None


@dataclass(frozen=True)
class Holder:
    """Who an allocation is held for: identity is the UID, the rest is for humans and repair."""

    kind: str
    namespace: str
    name: str
    uid: str

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "namespace": self.namespace, "name": self.name, "uid": self.uid}


def allocation_manifest(address: IPAddress, class_name: str, holder: Holder) -> dict[str, Any]:
    """The IPAddressAllocation whose creation locks ``address`` for ``holder``."""
    return {
        "apiVersion": API_VERSION,
        "kind": IP_ADDRESS_ALLOCATION_KIND,
        "metadata": {"name": allocation_name(address)},
        "spec": {"address": str(address), "className": class_name, "holder": holder.as_dict()},
    }


def _list(spec: Mapping[str, Any], key: str) -> list[Any]:
    value = spec.get(key) or []
    if not isinstance(value, list):
        raise InvalidPool(f"spec.{key} is not a list")
    return value


def _merge(spans: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sorted spans with overlapping and adjacent ones joined, so no address is yielded twice."""
    merged: list[tuple[int, int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return tuple(merged)


def _in_segments(segments: tuple[tuple[int, int], ...], value: int) -> bool:
    index = bisect.bisect_right(segments, value, key=lambda segment: segment[0]) - 1
    return index >= 0 and segments[index][0] <= value <= segments[index][1]
