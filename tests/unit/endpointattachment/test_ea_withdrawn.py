"""MultipleBackends keeps a rendered VM-mode Service, its backends withdrawn (``reconcile`` module
docstring, ``datapath.withdrawn_selector``): one invariant per test.

- the live Service is patched, never deleted: its selector gains our key valued with the
  attachment's UID (no pod carries it: its Endpoints empty, cozy-proxy programs nothing), and
  nothing else of it changes, so the driver's pin, and so the address, stay;
- a second pass over the withdrawn Service plans nothing (one write to go dark);
- one ready backend again is one patch that removes the key (the endpoint's selector exactly), and
  the status waits for the Endpoints' answer (``Plan.restoring``, ``waits_for_answer``);
- with the Endpoints naming the one backend it is Provisioned at that pod, on the same Service;
- without a Service, MultipleBackends renders nothing (decided before anything renders);
- only the count of backends keeps it: a lost exclusivity withdraws (deletes) the Service as before.

That a withdrawn Service still holds its pods for every rival (``datapath.served_selector``) is in
``test_ea_datapath_rules``.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from operators.endpointattachment.api import METALLB_IPS_ANNOTATION, WITHDRAWN_SELECTOR_KEY
from operators.endpointattachment.reasons import (
    CONDITION_PROVISIONED,
    REASON_MULTIPLE_BACKENDS,
    REASON_NO_READY_BACKEND,
    REASON_PROVISIONED,
)
from operators.endpointattachment.reconcile import Observed, Plan, ServiceAction, reconcile
from shared.conditions import FALSE, TRUE
from tests.ea_builders import (
    ADDRESS,
    ATTACHMENT_UID,
    CLAIM,
    make_endpoints,
    make_endpointslice,
    make_pod,
)
from tests.unit.endpointattachment.test_ea_reconcile import (
    CHART_PROXY,
    VM_POD,
    attached,
    condition,
    message,
    settle,
    vm_observe,
)

ONE = (("pod-uid-1", "10.244.0.10", True),)
TWO = (("pod-uid-1", "10.244.0.10", True), ("pod-uid-2", "10.244.0.11", True))
SECOND_POD = make_pod("virt-launcher-vm1-b", uid="pod-uid-2", labels=VM_POD)


def live() -> Observed:
    """A VM-mode attachment Provisioned at pod-uid-1, its Service pinned and announced."""
    return attached(vm_observe())


def with_backends(observed: Observed, backends: Any) -> Observed:
    pods = [*observed.pods, SECOND_POD] if len(backends) > 1 else list(observed.pods)
    return dataclasses.replace(
        observed, endpoint_slices=[make_endpointslice("vm-vm1", backends=backends)], pods=pods
    )


def applied(observed: Observed, plan: Plan, endpoints: Any = ()) -> Observed:
    """The world after the glue applied ``plan``'s Service patch (merge) and its status, with the
    rendered Service's v1 Endpoints then listing ``endpoints``."""
    after = settle(observed, plan)
    services = [copy.deepcopy(dict(s)) for s in after.services]
    patch = plan.service_patch or {}
    selector = dict(services[0]["spec"].get("selector") or {})
    for key, value in ((patch.get("spec") or {}).get("selector") or {}).items():
        if value is None:
            selector.pop(key, None)
        else:
            selector[key] = value
    services[0]["spec"]["selector"] = selector
    name = services[0]["metadata"]["name"]
    return dataclasses.replace(
        after, services=services, rendered_endpoints=make_endpoints(name, backends=endpoints)
    )


def test_multiple_backends_patch_the_live_service_to_a_withdrawn_selector_and_nothing_else() -> None:
    before = live()
    plan = reconcile(with_backends(before, TWO))
    assert plan.service_action is ServiceAction.PATCH
    assert plan.service_patch == {"spec": {"selector": {WITHDRAWN_SELECTOR_KEY: ATTACHMENT_UID}}}
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_MULTIPLE_BACKENDS)
    assert "kept" in message(plan), message(plan)
    assert "withdrawn" in message(plan), message(plan)
    service = before.services[0]
    assert plan.status["serviceName"] == service["metadata"]["name"], "the Service lives on"
    assert (plan.status["claimName"], plan.status["addresses"]) == (CLAIM, [ADDRESS])
    assert plan.status["phase"] == "Pending"
    assert plan.programmed is None
    assert not plan.restoring
    assert METALLB_IPS_ANNOTATION in service["metadata"]["annotations"], "the pin is not ours to touch"


def test_a_withdrawn_service_is_left_alone_while_two_backends_remain() -> None:
    dark = with_backends(live(), TWO)
    first = reconcile(dark)
    again = reconcile(applied(dark, first))
    assert again.service_action is ServiceAction.NONE
    assert condition(again, CONDITION_PROVISIONED) == (FALSE, REASON_MULTIPLE_BACKENDS)
    assert again.status_patch(applied(dark, first).attachment.get("status"), "2024-01-01T00:00:00Z") == []


def test_one_backend_again_is_one_patch_restoring_the_endpoint_s_selector() -> None:
    dark = with_backends(live(), TWO)
    withdrawn = applied(dark, reconcile(dark))
    healed = with_backends(withdrawn, ONE)
    plan = reconcile(healed)
    assert plan.service_action is ServiceAction.PATCH
    assert plan.service_patch == {"spec": {"selector": {WITHDRAWN_SELECTOR_KEY: None}}}
    assert plan.restoring
    # The Endpoints have not answered yet: the status waits for them (the glue holds it).
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_NO_READY_BACKEND)
    assert plan.waits_for_answer


def test_restored_with_its_endpoints_it_is_provisioned_on_the_same_service() -> None:
    before = live()
    dark = with_backends(before, TWO)
    withdrawn = applied(dark, reconcile(dark))
    healed = with_backends(withdrawn, ONE)
    restored = applied(healed, reconcile(healed), endpoints=ONE)
    plan = reconcile(restored)
    assert condition(plan, CONDITION_PROVISIONED) == (TRUE, REASON_PROVISIONED)
    assert plan.service_action is ServiceAction.NONE
    assert restored.services[0]["metadata"]["uid"] == before.services[0]["metadata"]["uid"]
    assert restored.services[0]["spec"]["selector"] == before.services[0]["spec"]["selector"]
    assert plan.status["phase"] == "Attached"


def test_without_a_service_multiple_backends_render_nothing() -> None:
    plan = reconcile(with_backends(vm_observe(), TWO))
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_MULTIPLE_BACKENDS)
    assert plan.service_action is ServiceAction.NONE
    assert plan.service is None


def test_a_lost_exclusivity_still_deletes_the_service() -> None:
    dark = dataclasses.replace(with_backends(live(), TWO), rivals=[CHART_PROXY])
    plan = reconcile(dark)
    assert plan.service_action is ServiceAction.DELETE
    # The first failure in datapath's order is the verdict; the Service goes all the same.
    assert condition(plan, CONDITION_PROVISIONED) == (FALSE, REASON_MULTIPLE_BACKENDS)
