"""repair: which IPAddressAllocations are orphans (and may be deleted), and a class's capacity and usage."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from operators.endpointattachment.constants import ENDPOINT_ATTACHMENT_KIND, IP_ADDRESS_CLAIM_KIND
from operators.endpointattachment.repair import HolderIdentity, Orphan, class_usage, orphans
from tests.ea_builders import ATTACHMENT_UID, CREATED, NAMESPACE, make_allocation, make_class

NOW = datetime(2024, 1, 1, 1, 0, 0, tzinfo=UTC)  # an hour after CREATED
GRACE = timedelta(minutes=5)
CLAIM_UID = "claim-uid-my-ip"
ATTACHMENT = (ENDPOINT_ATTACHMENT_KIND, NAMESPACE, "db-public")
CLAIM = (IP_ADDRESS_CLAIM_KIND, NAMESPACE, "my-ip")
LIVE: dict[str, HolderIdentity] = {ATTACHMENT_UID: ATTACHMENT, CLAIM_UID: CLAIM}

Obj = dict[str, Any]


def held_by(holder: HolderIdentity, holder_uid: str, **changes: Any) -> Obj:
    return make_allocation(holder=(*holder, holder_uid), **changes)


# --- orphans ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allocation", "orphaned", "wording"),
    [
        pytest.param(make_allocation(), False, None, id="live attachment kept"),
        pytest.param(held_by(CLAIM, CLAIM_UID), False, None, id="live claim kept"),
        pytest.param(held_by(ATTACHMENT, "ea-uid-gone"), True, "is gone", id="holder gone"),
        pytest.param(
            held_by((ENDPOINT_ATTACHMENT_KIND, NAMESPACE, "renamed"), ATTACHMENT_UID),
            True,
            "not EndpointAttachment tenant-a/renamed",
            id="uid names another object",
        ),
        pytest.param(
            held_by((ENDPOINT_ATTACHMENT_KIND, "tenant-b", "db-public"), ATTACHMENT_UID),
            True,
            "tenant-b",
            id="uid in another namespace",
        ),
        pytest.param(
            held_by((IP_ADDRESS_CLAIM_KIND, NAMESPACE, "db-public"), ATTACHMENT_UID),
            True,
            "IPAddressClaim",
            id="uid of another kind",
        ),
        pytest.param(make_allocation(holder=None), True, "no holder", id="no holder"),
        pytest.param(held_by(ATTACHMENT, ""), True, "no holder", id="empty holder uid"),
        pytest.param(
            held_by(ATTACHMENT, "gone", created="2024-01-01T00:56:00Z"), False, None, id="within grace kept"
        ),
        pytest.param(
            held_by(ATTACHMENT, "gone", created="2024-01-01T00:55:00Z"), False, None, id="at grace kept"
        ),
        pytest.param(
            held_by(ATTACHMENT, "gone", created="2024-01-01T00:54:59Z"), True, "is gone", id="past grace"
        ),
        pytest.param(
            held_by(ATTACHMENT, "gone", created="2024-01-01T02:00:00Z"),
            False,
            None,
            id="from the future kept",
        ),
        pytest.param(held_by(ATTACHMENT, "gone", created=None), False, None, id="undated kept"),
        pytest.param(held_by(ATTACHMENT, "gone", created="yesterday"), False, None, id="garbage date kept"),
        pytest.param(
            held_by(ATTACHMENT, "gone", created="2024-01-01T00:00:00"), False, None, id="no timezone kept"
        ),
        pytest.param(
            held_by(ATTACHMENT, "gone")
            | {"metadata": {"name": "203.0.113.10", "creationTimestamp": CREATED}},
            False,
            None,
            id="no uid to precondition on kept",
        ),
    ],
)
def test_orphans(allocation: Obj, orphaned: bool, wording: str | None) -> None:
    found = orphans([allocation], LIVE, NOW, GRACE)
    if not orphaned:
        assert found == ()
        return
    assert len(found) == 1
    assert found[0].name == allocation["metadata"]["name"]
    assert found[0].uid == allocation["metadata"]["uid"]
    assert wording is not None
    assert wording in found[0].reason


def test_orphans_are_sorted_by_name_and_live_ones_left_out() -> None:
    allocations = [
        held_by(ATTACHMENT, "gone-1", address="203.0.113.12"),
        make_allocation("203.0.113.10"),
        held_by(CLAIM, "gone-2", address="203.0.113.11"),
        held_by(CLAIM, CLAIM_UID, address="2001:db8::1"),
    ]
    found = orphans(allocations, LIVE, NOW, GRACE)
    assert [o.name for o in found] == ["203.0.113.11", "203.0.113.12"]
    assert found[0] == Orphan(
        name="203.0.113.11",
        uid="alloc-uid-203.0.113.11",
        reason="holder IPAddressClaim tenant-a/my-ip (uid gone-2) of 203.0.113.11 is gone",
    )


def test_no_live_holders_orphans_every_dated_allocation() -> None:
    allocations = [make_allocation(f"203.0.113.{i}") for i in range(1, 4)]
    assert len(orphans(allocations, {}, NOW, GRACE)) == 3


def test_now_must_carry_a_timezone() -> None:
    with pytest.raises(ValueError, match="timezone"):
        orphans([make_allocation()], LIVE, NOW.replace(tzinfo=None), GRACE)


# --- orphans: properties ----------------------------------------------------------------------------

UIDS = ["u1", "u2", "u3", "u4"]
IDENTITIES = [
    (kind, namespace, name)
    for kind in (ENDPOINT_ATTACHMENT_KIND, IP_ADDRESS_CLAIM_KIND)
    for namespace in ("tenant-a", "tenant-b")
    for name in ("x", "y")
]
TIMESTAMPS = [None, "garbage", "2024-01-01T00:00:00Z", "2024-01-01T00:59:00Z", "2024-01-01T00:55:00Z"]

allocation_specs = st.lists(
    st.tuples(st.sampled_from(UIDS), st.sampled_from(IDENTITIES), st.sampled_from(TIMESTAMPS), st.booleans()),
    max_size=12,
)


@given(specs=allocation_specs, live=st.dictionaries(st.sampled_from(UIDS), st.sampled_from(IDENTITIES)))
def test_orphans_never_include_a_live_holders_allocation(
    specs: list[tuple[str, HolderIdentity, str | None, bool]], live: dict[str, HolderIdentity]
) -> None:
    allocations = [
        held_by(identity, uid, address=f"203.0.113.{i + 1}", created=created, uid=f"a{i}")
        for i, (uid, identity, created, has_uid) in enumerate(specs)
    ]
    for allocation, (_, _, _, has_uid) in zip(allocations, specs, strict=True):
        if not has_uid:
            del allocation["metadata"]["uid"]
    found = {orphan.name: orphan for orphan in orphans(allocations, live, NOW, GRACE)}
    for allocation in allocations:
        metadata, holder = allocation["metadata"], allocation["spec"]["holder"]
        orphan = found.get(metadata["name"])
        if live.get(holder["uid"]) == (holder["kind"], holder["namespace"], holder["name"]):
            assert orphan is None
        if orphan is not None:
            assert orphan.uid == metadata["uid"]
            created = datetime.fromisoformat(metadata["creationTimestamp"])
            assert NOW - created > GRACE


# --- class usage ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address_class", "capacity"),
    [
        pytest.param(make_class(), 62, id="/26 minus network and broadcast"),
        pytest.param(make_class(exclude=["203.0.113.1", "203.0.113.0"]), 61, id="exclusions counted once"),
        pytest.param(
            make_class(cidrs=None, ranges=[{"start": "198.51.100.10", "end": "198.51.100.19"}]),
            10,
            id="range taken as written",
        ),
        pytest.param(make_class(cidrs=["2001:db8::/126"]), 3, id="ipv6 minus subnet-router anycast"),
        pytest.param(make_class(cidrs=[]), 0, id="empty"),
        pytest.param(make_class(cidrs=["203.0.113.0/33"]), None, id="bad cidr"),
        pytest.param(make_class(cidrs=["203.0.113.0/26", "2001:db8::/64"]), None, id="mixed families"),
        pytest.param(make_class(provider="F5"), None, id="unknown provider"),
    ],
)
def test_class_capacity(address_class: Obj, capacity: int | None) -> None:
    assert class_usage(address_class, []) == (capacity, 0)


def test_class_allocated_counts_only_its_own_allocations() -> None:
    allocations = [
        make_allocation("203.0.113.1"),
        held_by(ATTACHMENT, "gone", address="203.0.113.2"),  # an orphan still holds its address
        make_allocation("198.51.100.1", class_name="private-v4"),
        {"metadata": {"name": "broken"}},
    ]
    assert class_usage(make_class(), allocations) == (62, 2)
    assert class_usage(make_class("private-v4"), allocations) == (62, 1)
    assert class_usage(make_class("unused"), allocations) == (62, 0)
