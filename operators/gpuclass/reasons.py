"""The GPUClass condition types, condition reasons and event reasons, each defined once.

Decides: the exact strings a hoster greps for and alerts on; each has a comment saying why.
Does not: decide when any of them applies (that is ``decide``).
"""

from __future__ import annotations

from typing import Final

# --- condition types (status.conditions is a map keyed on type) --------------------------------

# True when an older class already claims this class's resourceName, so this one can never serve.
CONDITION_RESOURCE_NAME_CONFLICT: Final = "ResourceNameConflict"
# Whether KubeVirt lets a VM ask for the resource at all (its permittedHostDevices table).
CONDITION_KUBEVIRT_PERMITTED: Final = "KubeVirtPermitted"
# "Can serve a VM in principle": the tenant-facing summary of the other two plus node eligibility.
CONDITION_READY: Final = "Ready"

# --- ResourceNameConflict reasons --------------------------------------------------------------

# Conflict True: the message names the older class that owns the name.
REASON_RESOURCE_NAME_IN_USE: Final = "ResourceNameInUse"
# Conflict False: this class is the oldest live class with its resourceName.
REASON_RESOURCE_NAME_OWNED: Final = "ResourceNameOwned"

# --- KubeVirtPermitted reasons -----------------------------------------------------------------

# True: the resourceName is in one of the permittedHostDevices tables.
REASON_PERMITTED: Final = "Permitted"
# True: the CR has no permittedHostDevices at all, so KubeVirt checks no name.
REASON_UNRESTRICTED: Final = "Unrestricted"
# True, for a class of DRA devices: the CR enables KubeVirt's GPUsWithDRA feature gate, so VMs get
# such GPUs through ResourceClaims and no permittedHostDevices entry is needed.
REASON_GPUS_WITH_DRA: Final = "GPUsWithDRA"
# False: a table exists and the name is not in it; KubeVirt refuses such VMs. For a class of DRA
# devices: the CR does not enable GPUsWithDRA (the message says so).
REASON_NOT_PERMITTED: Final = "NotPermitted"
# False: the KubeVirt kind is not served or no CR exists; no VM can start at all.
REASON_KUBEVIRT_NOT_INSTALLED: Final = "KubeVirtNotInstalled"
# Unknown: the CR could not be read (403, or failures longer than the grace period).
REASON_KUBEVIRT_UNREADABLE: Final = "KubeVirtUnreadable"

# --- Ready reasons (False reasons repeat the cause's name, so one column explains it) -----------

# True: no conflict, permitted, and an eligible node advertises at least one unit.
REASON_READY: Final = "Ready"
# False: another class owns the resourceName.
REASON_READY_RESOURCE_NAME_CONFLICT: Final = "ResourceNameConflict"
# False: KubeVirt does not permit the resourceName.
REASON_READY_NOT_PERMITTED: Final = REASON_NOT_PERMITTED
# False: KubeVirt is not installed.
REASON_READY_KUBEVIRT_NOT_INSTALLED: Final = REASON_KUBEVIRT_NOT_INSTALLED
# False: no Ready, uncordoned, tolerated node advertises the resource with allocatable >= 1.
REASON_NO_ELIGIBLE_NODES: Final = "NoEligibleNodes"
# False, for a class of DRA devices: its DeviceClass does not exist (or DRA is not served).
REASON_DEVICE_CLASS_NOT_FOUND: Final = "DeviceClassNotFound"
# Unknown: everything else holds but the KubeVirt permission cannot be read (the design lists no
# Ready reason for it; reusing the permission's reason points at the cause).
REASON_READY_KUBEVIRT_UNREADABLE: Final = REASON_KUBEVIRT_UNREADABLE

# --- events (emitted on transitions only, never every pass) ------------------------------------

# core/v1 Event types.
EVENT_NORMAL: Final = "Normal"
EVENT_WARNING: Final = "Warning"

# Warning: the class just lost (or was created without) its resourceName.
EVENT_RESOURCE_NAME_CONFLICT: Final = "ResourceNameConflict"
# Warning: KubeVirt stopped (or never started) permitting the resourceName.
EVENT_NOT_PERMITTED: Final = "NotPermitted"
# Warning: KubeVirt is (now) not installed.
EVENT_KUBEVIRT_NOT_INSTALLED: Final = "KubeVirtNotInstalled"
# Warning: the permission became unknown (the design asks for a warning event on 403).
EVENT_KUBEVIRT_UNREADABLE: Final = "KubeVirtUnreadable"
# Warning: free units went from some to none.
EVENT_EXHAUSTED: Final = "Exhausted"
# Normal: the class took over its resourceName (the older owner went away).
EVENT_RESOURCE_NAME_OWNED: Final = "ResourceNameOwned"
# Normal: KubeVirt permits the resourceName again.
EVENT_PERMITTED: Final = "Permitted"
# Normal: free units went from none to some.
EVENT_CAPACITY_AVAILABLE: Final = "CapacityAvailable"
