"""What the EndpointAttachment operator has observed: the kinds it caches, their named indexes, and
the read view a pass assembles its ``Observed`` from.

Decides: every kind the operator caches (``CACHES``; the substrate's three kinds are *optional*:
their informers stay synced and empty while the substrate's CRDs are not served, and fill when
they appear, without a restart) and the named indexes each cache keeps (the runtime's ``Store``
files every object under its index values on each change, so no pass or wake-up scans every
object); what each query of ``World`` answers (the Services and claims an attachment controls, by
owner reference; the application of an ``applicationRef``; the claim's addresses and other users;
the rivals for a namespace's pods in the VM modes); and how the ``Observed`` of one attachment is
assembled from the caches, without any LIST.

Does not: talk to the API or keep any object itself (the runtime's informers fill the stores, from
watches and from the answers of our own writes), decide which pass a change wakes (``controller``'s
map functions do), decide anything about an attachment, or trust a label for ownership.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from operators.endpointattachment.api import (
    ADDRESSES,
    ATTACHMENTS,
    CLAIM_ANNOTATION,
    CLAIM_PHASE_BOUND,
    CLAIMS,
    CLASSES,
    ENDPOINTSLICE_SERVICE_NAME_LABEL,
    FAMILY_IPV4,
    SERVICE_PROXY_NAME_LABEL,
    AttachmentSpec,
    AttachmentView,
    attachment_view,
)
from operators.endpointattachment.datapath import (
    ProxiedService,
    could_render,
    rank_of,
    selected_pods,
    served_selector,
    slice_pods,
    survivors,
    uncached_rank,
)
from operators.endpointattachment.endpoint import resolve
from operators.endpointattachment.reasons import CONDITION_PROVISIONED, REASON_WAITING_FOR_ADDRESS
from operators.endpointattachment.reconcile import Observed, provisioning_class
from operators.endpointattachment.render import RenderSettings, publish_ports
from shared.lineage import application_of
from shared.ownership import names_kind, sole_controller
from shared.resources import ENDPOINT_SLICES, ENDPOINTS, HELMRELEASES, PODS, SERVICES, Resource
from shared.runtime.cache import Indexer, Key, Obj, Store, View, key_of, strip_managed_fields
from shared.runtime.controller import Cache, Caches, StaticCaches
from shared.runtime.served import CRDS, crd_name, established, slim_crd

# Every kind a pass or a wake-up reads; nothing else is watched. The v1 Endpoints are read for the
# rendered VM-mode Services only: what cozy-proxy reads (never EndpointSlices).
RESOURCES: Final = (
    ATTACHMENTS,
    CLAIMS,
    CLASSES,
    ADDRESSES,
    SERVICES,
    ENDPOINT_SLICES,
    ENDPOINTS,
    HELMRELEASES,
    PODS,
)
# The address substrate's kinds: another component's, whose CRDs may come after we started.
SUBSTRATE: Final = (CLAIMS, CLASSES, ADDRESSES)
# Pods that are done never back a Service again: the Pod cache leaves them out.
POD_FIELD_SELECTOR: Final = "status.phase!=Succeeded,status.phase!=Failed"

# --- index names (the value each object is filed under is in the comment) --------------------------

# (namespace, spec.endpoint.serviceName): the attachments a change of that Service concerns.
BY_ENDPOINT: Final = "endpoint"
# (namespace, spec.loadBalancer.claimName): the attachments referencing a claim.
BY_CLAIM: Final = "claim"
# (namespace, group, kind, name) of an attachment's applicationRef, or of a HelmRelease's lineage.
BY_APPLICATION: Final = "application"
# metadata.namespace.
BY_NAMESPACE: Final = "namespace"
# True for attachments with a VM method: the only ones proxied Services, slices and pods concern.
VM_MODE: Final = "vm-mode"
# The UID of an object's controller when that is an EndpointAttachment: its Services and claims.
BY_CONTROLLER: Final = "controller"
# (namespace, claim) a Service names in CLAIM_ANNOTATION: a claim's users.
BY_CLAIM_ANNOTATION: Final = "claim-annotation"
# True for Services delegated to a datapath proxy (exclusivity is judged among them).
PROXIED: Final = "proxied"
# (namespace, kubernetes.io/service-name) of an EndpointSlice.
BY_SERVICE: Final = "service"
# (namespace, name) of an IPAddress's spec.claimRef.
BY_CLAIM_REF: Final = "claim-ref"
# The class a claim resolved to (status.className, else spec.className).
BY_CLASS: Final = "class"
# The class of a claim the substrate is provisioning (``reconcile.provisioning_class``).
PROVISIONING: Final = "provisioning"
# True for attachments whose stored status waits for an address with no Service of theirs named (the
# ones the hand-over hold may keep back): the few a class's finished burst wakes.
HELD_BACK: Final = "held-back"


def _metadata(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}


def labels(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    found = _metadata(obj).get("labels") or {}
    return found if isinstance(found, Mapping) else {}


def _namespace(obj: Obj) -> list[str]:
    return [key_of(obj)[0]]


def _attachment_endpoint(view: AttachmentView) -> list[Key]:
    name = view.spec.endpoint
    return [(view.namespace, name)] if name else []


def _attachment_claim(view: AttachmentView) -> list[Key]:
    name = view.spec.claim_name
    return [(view.namespace, name)] if name else []


def _attachment_namespace(view: AttachmentView) -> list[str]:
    return [view.namespace]


def application_key(view: AttachmentView) -> tuple[str, str, str, str]:
    """(namespace, group, kind, name) of an attachment's applicationRef."""
    spec = view.spec
    return (view.namespace, spec.app_group, spec.app_kind, spec.app_name)


def _attachment_application(view: AttachmentView) -> list[tuple[str, str, str, str]]:
    return [application_key(view)]


def _attachment_vm_mode(view: AttachmentView) -> list[bool]:
    return [True] if view.spec.vm_mode else []


def _release_application(obj: Obj) -> list[tuple[str, str, str, str]]:
    app = application_of(obj)
    return [(key_of(obj)[0], app.group, app.kind, app.name)] if app is not None else []


def controller_attachment_uid(obj: Mapping[str, Any]) -> str | None:
    """The UID of the object's controller when that is an EndpointAttachment."""
    owner = sole_controller(obj) or {}
    if not names_kind(owner, ATTACHMENTS):
        return None
    return str(owner.get("uid") or "") or None


def _controller(obj: Obj) -> list[str]:
    uid = controller_attachment_uid(obj)
    return [uid] if uid else []


def _claim_annotation(obj: Obj) -> list[Key]:
    claim = (_metadata(obj).get("annotations") or {}).get(CLAIM_ANNOTATION)
    return [(key_of(obj)[0], str(claim))] if claim else []


def claim_class_name(claim: Mapping[str, Any]) -> str | None:
    """The class a claim resolved to (``status.className``), else the one it asks for."""
    name = (claim.get("status") or {}).get("className") or (claim.get("spec") or {}).get("className")
    return str(name) if name else None


def _claim_class(obj: Obj) -> list[str]:
    name = claim_class_name(obj)
    return [name] if name else []


def _attachment_held_back(view: AttachmentView) -> list[bool]:
    status = view.status
    if status.get("serviceName"):
        return []
    waiting = any(
        isinstance(c, Mapping)
        and c.get("type") == CONDITION_PROVISIONED
        and c.get("reason") == REASON_WAITING_FOR_ADDRESS
        for c in status.get("conditions") or []
    )
    return [True] if waiting else []


def _claim_provisioning(obj: Obj) -> list[str]:
    name = provisioning_class(obj)
    return [name] if name else []


def _service_proxied(obj: Obj) -> list[bool]:
    return [True] if SERVICE_PROXY_NAME_LABEL in labels(obj) else []


def _slice_service(obj: Obj) -> list[Key]:
    service = labels(obj).get(ENDPOINTSLICE_SERVICE_NAME_LABEL)
    return [(key_of(obj)[0], service)] if service else []


def _claim_ref(obj: Obj) -> list[Key]:
    ref = (obj.get("spec") or {}).get("claimRef") or {}
    if not isinstance(ref, Mapping) or not ref.get("name"):
        return []
    return [(str(ref.get("namespace") or ""), str(ref["name"]))]


# The named indexes of each cache; ``build`` and the tests make their stores from these alone.
INDEXERS: Final[Mapping[Resource, Mapping[str, Indexer]]] = {
    ATTACHMENTS: {
        BY_ENDPOINT: _attachment_endpoint,
        BY_CLAIM: _attachment_claim,
        BY_APPLICATION: _attachment_application,
        BY_NAMESPACE: _attachment_namespace,
        VM_MODE: _attachment_vm_mode,
        HELD_BACK: _attachment_held_back,
    },
    CLAIMS: {BY_CONTROLLER: _controller, BY_CLASS: _claim_class, PROVISIONING: _claim_provisioning},
    ADDRESSES: {BY_CLAIM_REF: _claim_ref},
    SERVICES: {BY_CONTROLLER: _controller, BY_CLAIM_ANNOTATION: _claim_annotation, PROXIED: _service_proxied},
    ENDPOINT_SLICES: {BY_SERVICE: _slice_service},
    HELMRELEASES: {BY_APPLICATION: _release_application},
    PODS: {BY_NAMESPACE: _namespace},
}


def slim_pod(pod: Obj) -> Obj:
    """A Pod reduced to what exclusivity reads (which Services select it), whatever else it carries."""
    metadata = pod.get("metadata") or {}
    kept = ("name", "namespace", "uid", "resourceVersion", "labels", "deletionTimestamp")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {k: metadata[k] for k in kept if k in metadata},
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }


# The typed views kept beside each stored version (``Store.view_of``): an attachment's spec is read
# by the indexes, the map functions, the read model and the planner, and typed once per version.
VIEWS: Final[Mapping[Resource, View]] = {ATTACHMENTS: attachment_view}

# How the operator caches each kind, for every wiring to declare: the named indexes, objects slimmed
# on arrival, only the unfinished Pods, and the substrate's kinds optional.
CACHES: Final = (
    *(
        Cache(
            resource,
            indexers=INDEXERS.get(resource, {}),
            transform=slim_pod if resource == PODS else strip_managed_fields,
            view=VIEWS.get(resource),
            field_selector=POD_FIELD_SELECTOR if resource == PODS else "",
            optional=resource in SUBSTRATE,
        )
        for resource in RESOURCES
    ),
    # Whether the substrate is served: its CRDs (every CRD, slimmed; the runtime keeps this cache for
    # any optional kind, and the wiring watches it to wake attachments when the substrate arrives).
    Cache(CRDS, transform=slim_crd),
)


def empty_stores() -> dict[Resource, Store]:
    """One empty store per cached kind, with the indexes ``build`` declares (tests, metrics checks)."""
    return {
        resource: Store(INDEXERS.get(resource, {}), VIEWS.get(resource)) for resource in (*RESOURCES, CRDS)
    }


def _oldest_first(objects: list[Obj]) -> list[Obj]:
    if len(objects) < 2:
        return objects
    return sorted(objects, key=lambda o: (str(_metadata(o).get("creationTimestamp") or ""), key_of(o)))


class World:
    """A read view over the operator's caches: the queries a pass and a wake-up ask."""

    def __init__(self, caches: Caches, settings: RenderSettings | None = None) -> None:
        self.caches = caches
        self.settings = settings or RenderSettings()
        self.attachments = caches.store(ATTACHMENTS)
        self.claims = caches.store(CLAIMS)
        self.classes = caches.store(CLASSES)
        self.addresses = caches.store(ADDRESSES)
        self.services = caches.store(SERVICES)
        self.slices = caches.store(ENDPOINT_SLICES)
        self.endpoints = caches.store(ENDPOINTS)
        self.helmreleases = caches.store(HELMRELEASES)
        self.pods = caches.store(PODS)

    @classmethod
    def empty(cls, settings: RenderSettings | None = None) -> World:
        """A world over fresh, empty stores (tests, and checks of what the metrics export)."""
        return cls(StaticCaches(empty_stores()), settings)

    def view(self, attachment: Mapping[str, Any]) -> AttachmentView:
        """The attachment's typed view, as the store keeps it for its stored version."""
        view: AttachmentView = self.attachments.view_of(attachment)  # type: ignore[arg-type]
        return view

    def spec(self, attachment: Mapping[str, Any]) -> AttachmentSpec:
        return self.view(attachment).spec

    def substrate_served(self) -> bool:
        served = self.caches.served
        return served(CLAIMS) and served(CLASSES) and served(ADDRESSES)  # SUBSTRATE

    # --- single objects --------------------------------------------------------------------------

    def helmrelease_of(self, attachment: Mapping[str, Any]) -> Obj | None:
        """The application object: the HelmRelease of the namespace with applicationRef's lineage (the
        oldest, should two carry it, as Cozystack's controller picks: every pass picks the same)."""
        found = self.helmreleases.index(BY_APPLICATION, application_key(self.view(attachment)))
        return _oldest_first(found)[0] if found else None

    def endpoint_of(self, attachment: Mapping[str, Any]) -> Obj | None:
        name = self.spec(attachment).endpoint
        return self.services.get((key_of(attachment)[0], name)) if name else None

    def services_of(self, attachment: Mapping[str, Any]) -> list[Obj]:
        """The Services this attachment controls (owner reference to its UID), oldest first."""
        uid = _metadata(attachment).get("uid")
        return _oldest_first(self.services.index(BY_CONTROLLER, str(uid))) if uid else []

    def claims_of(self, attachment: Mapping[str, Any]) -> list[Obj]:
        """The claims this attachment controls (minted), oldest first."""
        uid = _metadata(attachment).get("uid")
        return _oldest_first(self.claims.index(BY_CONTROLLER, str(uid))) if uid else []

    def claim_for(self, attachment: Mapping[str, Any]) -> tuple[Obj | None, list[Obj]]:
        """The claim the attachment uses (referenced, or its oldest minted) and its surplus minted ones."""
        spec = self.spec(attachment)
        owned = self.claims_of(attachment)
        if spec.claim_name:
            return self.claims.get((key_of(attachment)[0], spec.claim_name)), owned
        return (owned[0] if owned else None), owned[1:]

    def addresses_of(self, claim: Mapping[str, Any] | None) -> list[Obj]:
        if claim is None:
            return []
        return self.addresses.index(BY_CLAIM_REF, key_of(claim))  # in key order

    def claim_users(self, claim: Mapping[str, Any] | None, attachment: Mapping[str, Any]) -> list[Obj]:
        """The live Services naming the claim that this attachment does not control."""
        if claim is None:
            return []
        uid = str(_metadata(attachment).get("uid") or "")
        return [
            s
            for s in self.services.index(BY_CLAIM_ANNOTATION, key_of(claim))
            if controller_attachment_uid(s) != uid
        ]

    def class_of(self, claim: Mapping[str, Any] | None) -> Obj | None:
        name = ((claim or {}).get("status") or {}).get("className") or ((claim or {}).get("spec") or {}).get(
            "className"
        )
        return self.classes.get(("", str(name))) if name else None

    # --- who is concerned ------------------------------------------------------------------------

    def provisioning(self, class_name: str) -> frozenset[Key]:
        """The claims of the class the substrate is provisioning."""
        return self.claims.index_keys(PROVISIONING, class_name)

    def provisioning_beside(self, claim: Mapping[str, Any] | None) -> int:
        """How many other claims of a Bound claim's class are being provisioned (0 for any other)."""
        status = (claim or {}).get("status") or {}
        if claim is None or status.get("phase") != CLAIM_PHASE_BOUND or not status.get("className"):
            return 0
        return len(self.provisioning(str(status["className"])) - {key_of(claim)})

    def attachments_using(self, claim: Key) -> set[Key]:
        """The attachments referencing the claim, and the one controlling it (that minted it)."""
        keys = set(self.attachments.index_keys(BY_CLAIM, claim))
        found = self.claims.get(claim)
        owner = self.attachment_controlling(found) if found is not None else None
        if owner is not None:
            keys.add(owner)
        return keys

    def substrate_catching_up(self) -> bool:
        """A substrate CRD is established but its informer has not listed yet: not synced, so no
        decision (a pass would take an empty cache for "no claim")."""
        caches = self.caches
        for resource in SUBSTRATE:
            if not caches.served(resource) and established(caches.store(CRDS).get(("", crd_name(resource)))):
                return True
        return False

    def in_vm_mode(self) -> frozenset[Key]:
        return self.attachments.index_keys(VM_MODE, True)

    def is_proxied(self, service: Key) -> bool:
        found = self.services.get(service)
        return found is not None and SERVICE_PROXY_NAME_LABEL in labels(found)

    def attachment_controlling(self, obj: Mapping[str, Any]) -> Key | None:
        """The attachment whose UID controls the object, if it is cached."""
        owner = sole_controller(obj) or {}
        uid = controller_attachment_uid(obj)
        if uid is None:
            return None
        key = (key_of(obj)[0], str(owner.get("name") or ""))
        found = self.attachments.get(key)
        return key if found is not None and _metadata(found).get("uid") == uid else None

    # --- the VM modes ----------------------------------------------------------------------------

    def slices_of(self, namespace: str, service: str) -> list[Obj]:
        return self.slices.index(BY_SERVICE, (namespace, service))  # in key order

    def pods_in(self, namespace: str) -> list[Obj]:
        return self.pods.index(BY_NAMESPACE, namespace)

    def proxied_services(self, namespace: str) -> list[ProxiedService]:
        """Every rival for pods of ``namespace``: each Service delegated to a proxy, with the pods its
        selector selects (ready or not) and its endpoints' pods, ranked by the attachment that
        rendered it (one not cached ranks after every cached one); then each VM-mode attachment not
        being deleted and without a live Service that could render (``datapath.could_render``, and
        Resolved, its endpoint selecting pods and publishing a port, no family but IPv4 asked: one
        that cannot takes no pod from one that can), with the pods its endpoint selects (a loser
        must never render, not even once)."""
        result: list[ProxiedService] = []
        rendered: set[str] = set()
        pods = self.pods_in(namespace)
        for service in self.services.index(PROXIED, True):  # in key order
            ns = key_of(service)[0]
            if ns != namespace:
                continue
            rank = None
            uid = controller_attachment_uid(service)
            if uid is not None:
                owner_key = self.attachment_controlling(service)
                attachment = self.attachments.get(owner_key) if owner_key else None
                owner_name = str((sole_controller(service) or {}).get("name") or "")
                rank = rank_of(attachment) if attachment is not None else uncached_rank(owner_name, ns, uid)
                rendered.add(uid)
            result.append(self._as_proxied(service, pods, rank))
        proxy_name = self.settings.proxy_name
        for key in sorted(self.in_vm_mode()):
            if key[0] != namespace:
                continue
            attachment = self.attachments.get(key)
            uid = str(_metadata(attachment).get("uid") or "")
            if attachment is None or _metadata(attachment).get("deletionTimestamp") or uid in rendered:
                continue
            spec = self.spec(attachment)
            endpoint = self.endpoint_of(attachment)
            endpoint_spec = (endpoint or {}).get("spec") or {}
            ports = publish_ports(endpoint_spec.get("ports") or [], spec) if endpoint is not None else None
            selector = endpoint_spec.get("selector") or None
            if (
                not could_render(spec.method, ports, proxy_name)
                or proxy_name is None
                or not ports
                or not selector
                or spec.family not in ("", FAMILY_IPV4)
                or not self._resolves(attachment, endpoint)
            ):
                continue  # never renders as it is: takes no pod from anyone
            result.append(
                ProxiedService(
                    namespace=namespace,
                    name="",
                    proxy_name=proxy_name,
                    backends=selected_pods(selector, pods)
                    | slice_pods(self.slices_of(namespace, spec.endpoint)),
                    attachment=rank_of(attachment),
                    selector=selector,
                )
            )
        return result

    def _resolves(self, attachment: Obj, endpoint: Obj | None) -> bool:
        """Whether the attachment is Resolved (``endpoint.resolve``): one that is not renders nothing,
        so it never takes a pod from an attachment that is (a typo of an applicationRef, a leftover
        of a recreated application)."""
        return resolve(attachment, self.spec(attachment), self.helmrelease_of(attachment), endpoint).ok

    def _as_proxied(self, service: Mapping[str, Any], pods: list[Obj], rank: Any = None) -> ProxiedService:
        metadata = _metadata(service)
        ns, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
        # A Service of ours whose backends are withdrawn (MultipleBackends) still holds its pods.
        selector = served_selector((service.get("spec") or {}).get("selector") or None)
        return ProxiedService(
            namespace=ns,
            name=name,
            proxy_name=str(labels(service).get(SERVICE_PROXY_NAME_LABEL) or ""),
            backends=selected_pods(selector, pods) | slice_pods(self.slices_of(ns, name)),
            attachment=rank,
            selector=selector,
            uid=str(metadata.get("uid") or ""),
            resource_version=str(metadata.get("resourceVersion") or ""),
        )

    def as_proxied(self, service: Mapping[str, Any]) -> ProxiedService | None:
        """A proxied Service as the exclusivity check sees it (None when not delegated to a proxy)."""
        if not labels(service).get(SERVICE_PROXY_NAME_LABEL):
            return None
        return self._as_proxied(service, self.pods_in(key_of(service)[0]))

    def survivors_of(
        self, service: Mapping[str, Any], rivals: Sequence[ProxiedService] | None = None
    ) -> list[Obj]:
        """The live proxied Services cozy-proxy must program again once ``service`` (a proxied Service
        of ours, as last seen) is deleted or changed (``datapath.survivors``), among ``rivals`` (the
        namespace's ``proxied_services`` as the pass read them; read now when not given). Each is
        read again from the cache: one this pass deleted is no survivor."""
        changed = self.as_proxied(service)
        if changed is None:
            return []
        keys = survivors(changed, rivals if rivals is not None else self.proxied_services(key_of(service)[0]))
        return [found for k in keys if (found := self.services.get(k)) is not None]

    # --- one pass --------------------------------------------------------------------------------

    def observe(self, key: Key) -> Observed | None:
        attachment = self.attachments.get(key)
        return self.observed(attachment) if attachment is not None else None

    def observed(self, attachment: Obj) -> Observed:
        """Everything ``reconcile`` needs about this attachment, from the caches."""
        namespace = key_of(attachment)[0]
        spec = self.spec(attachment)
        claim, surplus = self.claim_for(attachment)
        services = self.services_of(attachment)
        vm = spec.vm_mode
        # The Service a pass judges is the oldest one not being deleted (``reconcile``'s): its v1
        # Endpoints, not those of a withdrawn predecessor that lingers with a finalizer.
        live = next((s for s in services if not _metadata(s).get("deletionTimestamp")), None)
        return Observed(
            attachment=attachment,
            spec=spec,
            settings=self.settings,
            helmrelease=self.helmrelease_of(attachment),
            endpoint=self.endpoint_of(attachment),
            substrate=self.substrate_served(),
            claim=claim,
            surplus_claims=surplus,
            claim_class=self.class_of(claim),
            addresses=self.addresses_of(claim),
            services=services,
            claim_users=self.claim_users(claim, attachment),
            provisioning=self.provisioning_beside(claim),
            endpoint_slices=self.slices_of(namespace, spec.endpoint) if vm else (),
            rendered_endpoints=self.endpoints.get(key_of(live)) if vm and live is not None else None,
            rivals=self.proxied_services(namespace) if vm else (),
            pods=self.pods_in(namespace) if vm else (),
        )
