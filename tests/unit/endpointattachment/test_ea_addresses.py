"""addresses: strict parsing, canonical text, allocation names, and the candidates of a class."""

from __future__ import annotations

import ipaddress
import itertools
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.endpointattachment.addresses import (
    AddressPool,
    Holder,
    InvalidAddress,
    InvalidPool,
    IPAddress,
    address_from_allocation_name,
    allocation_manifest,
    allocation_name,
    canonical,
    family_of,
    first_free,
    is_canonical,
    parse_address,
    parse_network,
    pool_of,
    start_offset,
)

# --- parsing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("203.0.113.10", "203.0.113.10", id="ipv4"),
        pytest.param("0.0.0.0", "0.0.0.0", id="ipv4 zero"),
        pytest.param("2001:db8::1", "2001:db8::1", id="ipv6"),
        pytest.param("2001:DB8::1", "2001:db8::1", id="ipv6 upper case canonicalised"),
        pytest.param("2001:0db8:0000::0001", "2001:db8::1", id="ipv6 group zeros canonicalised"),
        pytest.param("::1", "::1", id="ipv6 loopback"),
    ],
)
def test_accepted(text: str, expected: str) -> None:
    assert canonical(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("010.0.0.1", id="ipv4 leading zero"),
        pytest.param("1.2.3.04", id="ipv4 leading zero last octet"),
        pytest.param("::ffff:1.2.3.4", id="ipv4-mapped dotted"),
        pytest.param("::ffff:102:304", id="ipv4-mapped hex"),
        pytest.param("::1.2.3.4", id="dotted quad in ipv6"),
        pytest.param("fe80::1%eth0", id="zone id"),
        pytest.param(" 1.2.3.4", id="leading space"),
        pytest.param("1.2.3.4\n", id="trailing newline"),
        pytest.param("1.2. 3.4", id="inner space"),
        pytest.param("\uff11.2.3.4", id="non-ascii digit"),
        pytest.param("", id="empty"),
        pytest.param("1.2.3", id="short"),
        pytest.param("0x1.2.3.4", id="hex octet"),
        pytest.param("1.2.3.4/32", id="cidr"),
        pytest.param("256.0.0.1", id="out of range"),
        pytest.param(None, id="None"),
        pytest.param(16909060, id="integer"),
    ],
)
def test_rejected(text: Any) -> None:
    with pytest.raises(InvalidAddress):
        parse_address(text)
    assert not is_canonical(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("203.0.113.1", True), ("2001:db8::1", True), ("2001:DB8::1", False), ("2001:db8:0::1", False)],
)
def test_is_canonical(text: str, expected: bool) -> None:
    assert is_canonical(text) is expected


def _v6_not_mapped(value: int) -> ipaddress.IPv6Address:
    """An IPv6 address that is not IPv4-mapped (those are rejected on purpose)."""
    address = ipaddress.IPv6Address(value)
    return address if address.ipv4_mapped is None else ipaddress.IPv6Address(value | (1 << 127))


v6_addresses: st.SearchStrategy[ipaddress.IPv6Address] = st.integers(0, 2**128 - 1).map(_v6_not_mapped)
any_address: st.SearchStrategy[IPAddress] = st.one_of(st.ip_addresses(v=4), v6_addresses)


@given(any_address)
def test_canonical_round_trip(address: IPAddress) -> None:
    text = canonical(str(address))
    assert parse_address(text) == address
    assert canonical(text) == text
    assert is_canonical(text)


@given(v6_addresses)
def test_ipv6_exploded_spelling_is_accepted_and_canonicalised(address: ipaddress.IPv6Address) -> None:
    assert canonical(address.exploded.upper()) == str(address)


@given(st.ip_addresses(v=4))
def test_ipv4_allocation_name_round_trip(address: ipaddress.IPv4Address) -> None:
    name = allocation_name(address)
    assert name == str(address)
    assert address_from_allocation_name(name) == address


@given(v6_addresses)
def test_ipv6_allocation_name_round_trip(address: ipaddress.IPv6Address) -> None:
    name = allocation_name(address)
    assert name.startswith("v6-")
    assert len(name) == 35
    assert name[3:] == name[3:].lower()
    assert address_from_allocation_name(name) == address
    assert allocation_name(str(address)) == name


@pytest.mark.parametrize(
    ("address", "name"),
    [("203.0.113.10", "203.0.113.10"), ("2001:db8::1", "v6-20010db8000000000000000000000001")],
)
def test_allocation_name_examples(address: str, name: str) -> None:
    assert allocation_name(address) == name


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("v6-20010DB8000000000000000000000001", id="upper hex"),
        pytest.param("v6-20010db800000000000000000000001", id="31 digits"),
        pytest.param("v6-20010db80000000000000000000000011", id="33 digits"),
        pytest.param("v6-00000000000000000000ffff01020304", id="ipv4-mapped"),
        pytest.param("v6-2001:db8::1", id="colons"),
        pytest.param("2001:db8::1", id="ipv6 text is not a name"),
        pytest.param("010.0.0.1", id="non-canonical ipv4"),
        pytest.param("v4-1.2.3.4", id="unknown prefix"),
    ],
)
def test_allocation_name_parse_rejects(name: str) -> None:
    with pytest.raises(InvalidAddress):
        address_from_allocation_name(name)


def test_family_of() -> None:
    assert family_of(parse_address("1.2.3.4")) == "IPv4"
    assert family_of(parse_address("2001:db8::1")) == "IPv6"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("10.0.0.1/24", id="host bits set"),
        pytest.param("10.0.0.0", id="no prefix"),
        pytest.param("10.0.0.0/33", id="prefix too long"),
        pytest.param("10.0.0.0/024", id="prefix leading zero"),
        pytest.param("010.0.0.0/24", id="address leading zero"),
        pytest.param("10.0.0.0/ 24", id="space"),
        pytest.param("::ffff:0:0/96", id="mapped"),
        pytest.param(42, id="not a string"),
    ],
)
def test_parse_network_rejects(text: Any) -> None:
    with pytest.raises(InvalidPool):
        parse_network(text)


# --- pools -----------------------------------------------------------------------------------------


def addrs(pool: AddressPool, start: int = 0) -> list[str]:
    return [str(a) for a in pool.candidates(start)]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(
            {"cidrs": ["10.0.0.0/30"]}, ["10.0.0.1", "10.0.0.2"], id="v4 /30 drops network and broadcast"
        ),
        pytest.param({"cidrs": ["10.0.0.0/31"]}, ["10.0.0.0", "10.0.0.1"], id="v4 /31 keeps both"),
        pytest.param({"cidrs": ["10.0.0.7/32"]}, ["10.0.0.7"], id="v4 /32"),
        pytest.param(
            {"cidrs": ["2001:db8::/126"]},
            ["2001:db8::1", "2001:db8::2", "2001:db8::3"],
            id="v6 /126 drops subnet-router anycast only",
        ),
        pytest.param({"cidrs": ["2001:db8::/127"]}, ["2001:db8::", "2001:db8::1"], id="v6 /127 keeps both"),
        pytest.param({"cidrs": ["2001:db8::5/128"]}, ["2001:db8::5"], id="v6 /128"),
        pytest.param(
            {"ranges": [{"start": "10.0.0.0", "end": "10.0.0.2"}]},
            ["10.0.0.0", "10.0.0.1", "10.0.0.2"],
            id="ranges are literal",
        ),
        pytest.param(
            {"cidrs": ["10.0.0.0/29"], "excludeAddresses": ["10.0.0.1", "10.0.0.6", "10.9.9.9"]},
            ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"],
            id="exclusions, including one outside the pool",
        ),
        pytest.param(
            {"cidrs": ["10.0.0.0/30"], "ranges": [{"start": "10.0.0.2", "end": "10.0.0.5"}]},
            ["10.0.0.1", "10.0.0.2", "10.0.0.4", "10.0.0.5"],
            id="a cidr's broadcast stays out even when a range lists it",
        ),
        pytest.param(
            {"ranges": [{"start": "10.0.0.1", "end": "10.0.0.3"}, {"start": "10.0.0.2", "end": "10.0.0.4"}]},
            ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"],
            id="overlaps merged, no duplicates",
        ),
        pytest.param(
            {"ranges": [{"start": "10.0.0.5", "end": "10.0.0.5"}, {"start": "10.0.0.1", "end": "10.0.0.1"}]},
            ["10.0.0.1", "10.0.0.5"],
            id="sorted ascending",
        ),
        pytest.param({}, [], id="empty class"),
    ],
)
def test_candidates(spec: dict[str, Any], expected: list[str]) -> None:
    pool = pool_of(spec)
    assert addrs(pool) == expected
    assert pool.capacity == len(expected)


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"cidrs": ["10.0.0.0/24", "2001:db8::/64"]}, id="mixed cidrs"),
        pytest.param({"cidrs": ["10.0.0.0/24"], "excludeAddresses": ["2001:db8::1"]}, id="mixed exclusion"),
        pytest.param({"ranges": [{"start": "10.0.0.1", "end": "2001:db8::1"}]}, id="mixed range"),
        pytest.param({"ranges": [{"start": "10.0.0.9", "end": "10.0.0.1"}]}, id="reversed range"),
        pytest.param({"ranges": [{"start": "10.0.0.1"}]}, id="range without end"),
        pytest.param({"ranges": ["10.0.0.1-10.0.0.2"]}, id="range not an object"),
        pytest.param({"cidrs": "10.0.0.0/24"}, id="cidrs not a list"),
        pytest.param({"cidrs": ["10.0.0.1/24"]}, id="host bits"),
        pytest.param({"excludeAddresses": ["010.0.0.1"]}, id="bad exclusion"),
    ],
)
def test_invalid_pools(spec: dict[str, Any]) -> None:
    with pytest.raises(InvalidPool):
        pool_of(spec)


def test_contains() -> None:
    pool = pool_of({"cidrs": ["10.0.0.0/29"], "excludeAddresses": ["10.0.0.3"]})
    assert pool.contains(parse_address("10.0.0.1"))
    assert not pool.contains(parse_address("10.0.0.0"))
    assert not pool.contains(parse_address("10.0.0.3"))
    assert not pool.contains(parse_address("10.0.0.8"))
    assert not pool.contains(parse_address("::a00:1"))


def test_start_offset_rotates_and_wraps() -> None:
    pool = pool_of({"cidrs": ["10.0.0.0/29"], "ranges": [{"start": "10.0.1.0", "end": "10.0.1.1"}]})
    base = addrs(pool)
    for start in range(-3, pool.span * 2 + 1):
        rotated = addrs(pool, start)
        assert sorted(rotated, key=ipaddress.ip_address) == sorted(base, key=ipaddress.ip_address)
        assert len(rotated) == len(set(rotated)) == pool.capacity
        # a rotation of the ascending order
        i = base.index(rotated[0])
        assert rotated == base[i:] + base[:i]


def test_start_offset_is_deterministic_and_in_range() -> None:
    pool = pool_of({"cidrs": ["203.0.113.0/26"]})
    offsets = {start_offset(pool, f"uid-{i}") for i in range(50)}
    assert all(0 <= o < pool.span for o in offsets)
    assert start_offset(pool, "uid-1") == start_offset(pool, "uid-1")
    assert len(offsets) > 20  # spread: concurrent minters rarely start on the same address
    assert start_offset(pool_of({}), "uid") == 0


def test_a_slash_21_is_fast() -> None:
    pool = pool_of({"cidrs": ["10.8.0.0/21"]})
    assert pool.capacity == 2046
    everything = [str(a) for a in pool.candidates()]
    taken = set(everything[:-1])
    began = time.perf_counter()
    for _ in range(10):
        assert str(first_free(pool.candidates(start_offset(pool, "x")), taken)) == everything[-1]
    assert time.perf_counter() - began < 1.0


def test_a_slash_64_is_never_materialised() -> None:
    pool = pool_of({"cidrs": ["2001:db8::/64"]})
    assert pool.capacity == 2**64 - 1
    offset = start_offset(pool, "holder")
    first = list(itertools.islice(pool.candidates(offset), 3))
    assert [int(b) - int(a) for a, b in itertools.pairwise(first)] in (
        [1, 1],
        [1, -(2**64 - 2)],
        [-(2**64 - 2), 1],
    )
    end = list(itertools.islice(pool.candidates(pool.span - 1), 2))
    assert [str(a) for a in end] == ["2001:db8::ffff:ffff:ffff:ffff", "2001:db8::1"]


def test_first_free() -> None:
    pool = pool_of({"cidrs": ["10.0.0.0/30"]})
    assert str(first_free(pool.candidates(), set())) == "10.0.0.1"
    assert str(first_free(pool.candidates(), {"10.0.0.1"})) == "10.0.0.2"
    assert first_free(pool.candidates(), {"10.0.0.1", "10.0.0.2"}) is None
    assert first_free(pool_of({}).candidates(), set()) is None


def test_allocation_manifest() -> None:
    holder = Holder(kind="EndpointAttachment", namespace="tenant-a", name="db-public", uid="u1")
    manifest = allocation_manifest(parse_address("2001:db8::1"), "public-v6", holder)
    assert manifest == {
        "apiVersion": "local.sdn.cozystack.io/v1alpha1",
        "kind": "IPAddressAllocation",
        "metadata": {"name": "v6-20010db8000000000000000000000001"},
        "spec": {
            "address": "2001:db8::1",
            "className": "public-v6",
            "holder": {
                "kind": "EndpointAttachment",
                "namespace": "tenant-a",
                "name": "db-public",
                "uid": "u1",
            },
        },
    }


# --- candidate iteration, against a brute-force oracle ---------------------------------------------

BASE = int(ipaddress.IPv4Address("10.0.0.0"))
REGION = 1024  # every generated pool lives inside 10.0.0.0/22


@st.composite
def small_pools(draw: st.DrawFn) -> dict[str, Any]:
    cidrs = []
    for _ in range(draw(st.integers(0, 3))):
        prefix = draw(st.integers(25, 32))
        size = 2 ** (32 - prefix)
        start = BASE + draw(st.integers(0, REGION // size - 1)) * size
        cidrs.append(f"{ipaddress.IPv4Address(start)}/{prefix}")
    ranges = []
    for _ in range(draw(st.integers(0, 3))):
        first = draw(st.integers(0, REGION - 1))
        last = draw(st.integers(first, min(REGION - 1, first + 100)))
        ranges.append(
            {
                "start": str(ipaddress.IPv4Address(BASE + first)),
                "end": str(ipaddress.IPv4Address(BASE + last)),
            }
        )
    excluded = [
        str(ipaddress.IPv4Address(BASE + draw(st.integers(0, REGION - 1))))
        for _ in range(draw(st.integers(0, 8)))
    ]
    return {"cidrs": cidrs, "ranges": ranges, "excludeAddresses": excluded}


def oracle(spec: dict[str, Any]) -> set[str]:
    """The candidates by brute force: every listed address, minus exclusions and cidr network/broadcast."""
    members: set[int] = set()
    forbidden = {int(ipaddress.IPv4Address(a)) for a in spec["excludeAddresses"]}
    for text in spec["cidrs"]:
        network = ipaddress.IPv4Network(text)
        members.update(range(int(network.network_address), int(network.broadcast_address) + 1))
        if network.prefixlen < 31:
            forbidden.update((int(network.network_address), int(network.broadcast_address)))
    for item in spec["ranges"]:
        members.update(
            range(int(ipaddress.IPv4Address(item["start"])), int(ipaddress.IPv4Address(item["end"])) + 1)
        )
    return {str(ipaddress.IPv4Address(v)) for v in members - forbidden}


@settings(max_examples=200)
@given(small_pools(), st.integers(0, 5000))
def test_candidate_iteration_properties(spec: dict[str, Any], start: int) -> None:
    pool = pool_of(spec)
    yielded = addrs(pool, start)
    assert len(yielded) == len(set(yielded)), "never duplicates"
    assert len(yielded) == pool.capacity, "count equals capacity"
    assert set(yielded) == oracle(spec), "exactly the class's addresses: nothing excluded, nothing outside"
    excluded = set(spec["excludeAddresses"])
    assert not excluded & set(yielded)
    for text in spec["cidrs"]:
        network = ipaddress.IPv4Network(text)
        if network.prefixlen < 31:
            assert str(network.network_address) not in yielded
            assert str(network.broadcast_address) not in yielded
    assert all(pool.contains(parse_address(a)) for a in yielded)
