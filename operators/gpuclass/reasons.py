"""The GPUClass condition types, condition reasons and event reasons, each defined once.

Decides: the exact strings a hoster greps for and alerts on, each declared with what it means and what
to do (``shared.reasons``): ``docs/hosters/conditions.md`` is generated from these declarations.
Does not: decide when any of them applies (that is ``decide``).
"""

from __future__ import annotations

from typing import Final

from shared.conditions import FALSE, TRUE, UNKNOWN
from shared.reasons import NOTHING, TENANT, Guide

GUIDE: Final = Guide("GPUClass")

# --- condition types (status.conditions is a map keyed on type) --------------------------------

CONDITION_RESOURCE_NAME_CONFLICT: Final = GUIDE.condition(
    "ResourceNameConflict",
    true_means="an older class has the same `spec.resourceName`; this class can never serve a VM",
)

CONDITION_KUBEVIRT_PERMITTED: Final = GUIDE.condition(
    "KubeVirtPermitted",
    true_means="KubeVirt lets a VM request the class's resource (its `permittedHostDevices`)",
)

# The tenant-facing summary of the other two plus node eligibility.
CONDITION_READY: Final = GUIDE.condition(
    "Ready",
    true_means=(
        "the class can serve a VM in principle: it owns its resource name, KubeVirt permits it, "
        "and some eligible node advertises at least one unit (`status.freeUnits` says how many "
        "are free now)"
    ),
)

# --- ResourceNameConflict reasons --------------------------------------------------------------

# The message names the older class that owns the name.
REASON_RESOURCE_NAME_IN_USE: Final = GUIDE.reason(
    "ResourceNameInUse",
    condition=CONDITION_RESOURCE_NAME_CONFLICT,
    status=TRUE,
    meaning=(
        "An older class (named in the message) already has this resource name. The oldest class, "
        "by creation time then name, owns a name; this one offers 0 units and is never Ready."
    ),
    remedy=(
        "Delete whichever of the two classes is the mistake. Deleting the owner hands the name "
        "to the next-oldest class at once. Tolerations cannot differ per class: to offer one GPU "
        "model under other terms, use another resource name (another device-plugin "
        "configuration)."
    ),
)

REASON_RESOURCE_NAME_OWNED: Final = GUIDE.reason(
    "ResourceNameOwned",
    condition=CONDITION_RESOURCE_NAME_CONFLICT,
    status=FALSE,
    meaning="This is the oldest live class with its resource name: it owns the name.",
    remedy=NOTHING,
)

# --- KubeVirtPermitted reasons -----------------------------------------------------------------

REASON_PERMITTED: Final = GUIDE.reason(
    "Permitted",
    condition=CONDITION_KUBEVIRT_PERMITTED,
    status=TRUE,
    meaning=(
        "The resource name is in one of the KubeVirt CR's `permittedHostDevices` tables "
        "(`pciHostDevices`, `mediatedDevices`, `usb`)."
    ),
    remedy=NOTHING,
)

REASON_UNRESTRICTED: Final = GUIDE.reason(
    "Unrestricted",
    condition=CONDITION_KUBEVIRT_PERMITTED,
    status=TRUE,
    meaning="The KubeVirt CR has no `permittedHostDevices` at all, so KubeVirt checks no device name.",
    remedy=(
        "Nothing is required. Most hosters list their devices explicitly; once a table exists, "
        "every class's name must be in it."
    ),
)

REASON_GPUS_WITH_DRA: Final = GUIDE.reason(
    "GPUsWithDRA",
    condition=CONDITION_KUBEVIRT_PERMITTED,
    status=TRUE,
    meaning=(
        "A class of DRA devices (`spec.deviceClassName`), and the KubeVirt CR lists the "
        "`GPUsWithDRA` feature gate: VMs get such GPUs through ResourceClaims, with no "
        "`permittedHostDevices` entry. Without the gate the class is `NotPermitted`, and the "
        "message says so."
    ),
    remedy=NOTHING,
)

# For a class of DRA devices: the CR does not enable GPUsWithDRA (the message says so).
REASON_NOT_PERMITTED: Final = GUIDE.reason(
    "NotPermitted",
    condition=CONDITION_KUBEVIRT_PERMITTED,
    status=FALSE,
    meaning=(
        "KubeVirt has a `permittedHostDevices` table and the resource name is not in it: "
        "KubeVirt refuses to start a VM that asks for it."
    ),
    remedy=(
        "Add the resource name to the KubeVirt CR (`spec.configuration.permittedHostDevices`), "
        "or fix the class's `resourceName` (it is immutable: create a new class and delete this "
        "one). The operator rereads the CR within a minute."
    ),
)

REASON_KUBEVIRT_NOT_INSTALLED: Final = GUIDE.reason(
    "KubeVirtNotInstalled",
    condition=CONDITION_KUBEVIRT_PERMITTED,
    status=FALSE,
    meaning=(
        "The KubeVirt kind is not served, or no KubeVirt CR exists in the configured namespace: "
        "no VM can start at all."
    ),
    remedy=(
        "Install KubeVirt, or point the operator at its CR (`--kubevirt-namespace`, "
        "`--kubevirt-name`; Cozystack's is `kubevirt` in `cozy-kubevirt`). Free units are still "
        "computed meanwhile."
    ),
)

REASON_KUBEVIRT_UNREADABLE: Final = GUIDE.reason(
    "KubeVirtUnreadable",
    condition=CONDITION_KUBEVIRT_PERMITTED,
    status=UNKNOWN,
    meaning=(
        "The KubeVirt CR could not be read: access was refused (403), the namespace holds "
        "several CRs and no name is configured, or the API server failed for longer than 3 "
        "minutes (until then the last answer is kept)."
    ),
    remedy=(
        "Check the operator's ClusterRole grants `get`/`list` on `kubevirts.kubevirt.io`, set "
        "`--kubevirt-name` when the namespace holds several CRs, and check the API server's "
        "health. The operator's log and a Warning Event say which."
    ),
)

# --- Ready reasons (False reasons repeat the cause's name, so one column explains it) -----------

REASON_READY: Final = GUIDE.reason(
    "Ready",
    condition=CONDITION_READY,
    status=TRUE,
    meaning=("No conflict, KubeVirt permits the resource, and at least one eligible node advertises it."),
    remedy="Nothing. `status.freeUnits` says how many units are free right now (possibly 0).",
    who=TENANT,
)

REASON_READY_RESOURCE_NAME_CONFLICT: Final = GUIDE.reason(
    "ResourceNameConflict",
    condition=CONDITION_READY,
    status=FALSE,
    meaning="Another class owns the resource name (see `ResourceNameConflict`).",
    remedy="Pick another class. Hosters: see `ResourceNameInUse` above.",
    who=TENANT,
)

REASON_READY_NOT_PERMITTED: Final = GUIDE.reason(
    REASON_NOT_PERMITTED,
    condition=CONDITION_READY,
    status=FALSE,
    meaning="KubeVirt does not permit the resource name (see `KubeVirtPermitted`).",
    remedy="Pick another class. Hosters: see `NotPermitted` above.",
    who=TENANT,
)

REASON_READY_KUBEVIRT_NOT_INSTALLED: Final = GUIDE.reason(
    REASON_KUBEVIRT_NOT_INSTALLED,
    condition=CONDITION_READY,
    status=FALSE,
    meaning="KubeVirt is not installed (see `KubeVirtPermitted`).",
    remedy="Hosters: see `KubeVirtNotInstalled` above.",
)

REASON_NO_ELIGIBLE_NODES: Final = GUIDE.reason(
    "NoEligibleNodes",
    condition=CONDITION_READY,
    status=FALSE,
    meaning=(
        "No node that is Ready, not cordoned, and whose NoSchedule/NoExecute taints the class "
        "tolerates advertises the resource with at least one allocatable unit."
    ),
    remedy=(
        "Check the GPU nodes: are they Ready, uncordoned, and does the device plugin advertise "
        "the resource (`kubectl describe node`)? Does the class tolerate the nodes' taints? The "
        "metric `cozystack_gpuclass_nodes{state=...}` counts the nodes that advertise it by why "
        "they are excluded (`not_ready`, `cordoned`, `untolerated_taint`)."
    ),
)

REASON_DEVICE_CLASS_NOT_FOUND: Final = GUIDE.reason(
    "DeviceClassNotFound",
    condition=CONDITION_READY,
    status=FALSE,
    meaning=(
        "The class names a DeviceClass (`spec.deviceClassName`) that does not exist, or the "
        "cluster serves no `resource.k8s.io/v1` at all."
    ),
    remedy=(
        "Create the DeviceClass your DRA driver documents (or fix the class: the name is "
        "immutable, so create a new class and delete this one). The class is decided again as "
        "soon as it appears."
    ),
)

# The design lists no Ready reason for it; reusing the permission's reason points at the cause.
REASON_READY_KUBEVIRT_UNREADABLE: Final = GUIDE.reason(
    REASON_KUBEVIRT_UNREADABLE,
    condition=CONDITION_READY,
    status=UNKNOWN,
    meaning=("Everything else holds, but the KubeVirt permission cannot be read (see `KubeVirtPermitted`)."),
    remedy="Hosters: see `KubeVirtUnreadable` above.",
)

# --- events (emitted on transitions only, never every pass) ------------------------------------

# Event types (events.k8s.io/v1).
EVENT_NORMAL: Final = "Normal"
EVENT_WARNING: Final = "Warning"

EVENT_RESOURCE_NAME_CONFLICT: Final = GUIDE.event(
    "ResourceNameConflict",
    type=EVENT_WARNING,
    meaning=("The class lost its resource name to an older class, or was created with a name already owned."),
    remedy="See `ResourceNameInUse`.",
)

EVENT_NOT_PERMITTED: Final = GUIDE.event(
    "NotPermitted",
    type=EVENT_WARNING,
    meaning="KubeVirt stopped (or never started) permitting the resource name.",
    remedy="See `NotPermitted`.",
)

EVENT_KUBEVIRT_NOT_INSTALLED: Final = GUIDE.event(
    "KubeVirtNotInstalled",
    type=EVENT_WARNING,
    meaning="KubeVirt is (now) not installed.",
    remedy="See `KubeVirtNotInstalled`.",
)

# The design asks for a warning event on 403.
EVENT_KUBEVIRT_UNREADABLE: Final = GUIDE.event(
    "KubeVirtUnreadable",
    type=EVENT_WARNING,
    meaning="The KubeVirt permission became unknown.",
    remedy="See `KubeVirtUnreadable`.",
)

EVENT_EXHAUSTED: Final = GUIDE.event(
    "Exhausted",
    type=EVENT_WARNING,
    meaning="Free units went from some to none: new VMs of the class will not find a GPU.",
    remedy="Add nodes, or wait for VMs to stop. `GPUClassExhausted` alerts after 30 minutes.",
)

EVENT_RESOURCE_NAME_OWNED: Final = GUIDE.event(
    "ResourceNameOwned",
    type=EVENT_NORMAL,
    meaning="The class took over its resource name (the older owner went away).",
    remedy=NOTHING,
)

EVENT_PERMITTED: Final = GUIDE.event(
    "Permitted",
    type=EVENT_NORMAL,
    meaning="KubeVirt permits the resource name again.",
    remedy=NOTHING,
)

EVENT_CAPACITY_AVAILABLE: Final = GUIDE.event(
    "CapacityAvailable",
    type=EVENT_NORMAL,
    meaning="Free units went from none to some.",
    remedy=NOTHING,
)
