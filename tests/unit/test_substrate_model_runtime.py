"""The substrate model declared on the project's runtime (``harness.substrate.wiring``, run by
``substrate``), without a cluster: what it caches and wakes, and the whole model over the in-memory
API (``harness.memapi``: real informers, the runtime's ``Writer``, the client's own verbs): a claim
bound with the API's answers in the stores, a taken name (409) skipped, a restarted model writing
nothing, and a failed write planned again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from harness.memapi import MemApi
from harness.substrate import (
    ADDRESSES,
    CLAIMS,
    CLASSES,
    DEFAULT_CLASS_ANNOTATION,
    KINDS,
    METALLB_PROVISIONER,
    MODEL_KEY,
    POOLS,
    SubstrateModel,
    address_name,
    substrate,
    wiring,
)
from shared.kube import ApiError
from shared.resources import SERVICES

NS: Final = "tenant-a"
TIMEOUT: Final = 5.0
FIRST, SECOND = "198.51.100.0", "198.51.100.1"


def test_the_wiring_caches_every_kind_the_model_reads_and_wakes_one_key() -> None:
    substrate_wiring = wiring()
    assert set(substrate_wiring.resources()) == set(KINDS)
    assert {cache.resource for cache in substrate_wiring.caches} == set(KINDS)
    assert all(cache.transform is None for cache in substrate_wiring.caches)  # kept as listed
    assert {c.field_selector for c in substrate_wiring.caches if c.resource == POOLS} == {
        "metadata.namespace=metallb-system"
    }
    assert substrate_wiring.key({"metadata": {"name": "any"}}) == MODEL_KEY
    assert all(list(w.map(None, {})) == [MODEL_KEY] for w in substrate_wiring.watches)
    without_l2 = wiring(l2_advertisements=False).resources()
    assert POOLS in without_l2
    assert len(without_l2) == len(KINDS) - 1


def seeded() -> MemApi:
    """A default class and one claim, as a hoster and a tenant left them."""
    api = MemApi()
    api.seed(
        CLASSES,
        {
            "apiVersion": CLASSES.api_version,
            "kind": "IPAddressClass",
            "metadata": {"name": "public", "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
            "spec": {"provisioner": METALLB_PROVISIONER, "parameters": {"addresses": ["198.51.100.0/30"]}},
        },
    )
    claim = {"metadata": {"name": "c1", "namespace": NS}, "spec": {"family": "IPv4"}}
    api.seed(CLAIMS, {"apiVersion": CLAIMS.api_version, "kind": "IPAddressClaim", **claim})
    return api


def bound_to(ip: str) -> Callable[[SubstrateModel], bool]:
    def holds(model: SubstrateModel) -> bool:
        status = (model.claim(NS, "c1") or {}).get("status") or {}
        return status.get("phase") == "Bound" and [a["address"] for a in status["addresses"]] == [ip]

    return holds


def writes(api: MemApi) -> list[tuple[str, str, str]]:
    """What was sent but reads (LIST, WATCH, GET)."""
    return [(r.verb, r.target.plural, r.target.name) for r in api.requests if r.method != "GET"]


async def test_a_claim_is_bound_with_the_api_s_answers_in_the_stores() -> None:
    api = seeded()
    async with substrate(api) as model:
        await model.wait_for(bound_to(FIRST), TIMEOUT, "c1 bound")
        await model.wait_for(lambda m: m.synced.is_set() and not m.plan(""), TIMEOUT, "settled")
        assert model.claim(NS, "c1") == api.stored(CLAIMS.path(NS, "c1"))
        assert model.address(address_name(FIRST)) == api.stored(ADDRESSES.path(None, address_name(FIRST)))
        placeholders = [key for key in model.services if key[1].startswith("iad-")]
        assert len(placeholders) == 1
    sent = len(writes(api))
    async with substrate(api) as again:  # restarted over the world it made: nothing to write
        await again.wait_for(lambda m: m.synced.is_set(), TIMEOUT, "the restarted model synced")
        assert again.log == []
    assert len(writes(api)) == sent


async def test_a_name_taken_meanwhile_is_skipped_for_the_next_address() -> None:
    api = seeded()
    taken = address_name(FIRST)
    # The first address's name taken by another writer between the model's read and its create.
    api.refuse(
        ApiError(409, "AlreadyExists", f"{taken} exists"), verb="create", plural="ipaddresses", times=1
    )
    async with substrate(api) as model:
        await model.wait_for(bound_to(SECOND), TIMEOUT, "c1 bound to the next address")
        assert taken in model.taken
        # The claim's placeholder re-pinned to the next IP: one plain Update behind its version.
        assert ("update", SERVICES.plural) in {(verb, plural) for verb, plural, _ in writes(api)}


async def test_a_failed_write_is_planned_again() -> None:
    api = seeded()
    api.refuse(
        ApiError(500, "InternalError", "etcd is away"), verb="patch", plural="ipaddressclaims", times=1
    )
    async with substrate(api) as model:
        await model.wait_for(bound_to(FIRST), TIMEOUT, "c1 bound after the refusal")
        assert any("500" in line for line in model.log)
