"""GPU011: a DRA ResourceClaim or ResourceClaimTemplate reaches GPUs only where the settings allow it.

ResourceClaims and ResourceClaimTemplates are namespaced, so tenants write them, and a claim the
scheduler allocates hands out a card outside the extender's accounting. Each device request (its
`exactly` and every `firstAvailable` alternative; `policies.gpu.dra.requests`) is judged:

- through a GPU DeviceClass (`dra.gpuClasses`), only in namespaces a `dra.claims` entry grants
  that class (none by default), anchored to namespaces as exceptions are;
- through any other class, its CEL selectors must not reach a GPU driver (`dra.gpuDrivers`): a
  selector that names one in any spelling, or inspects the driver or the attribute domains in a
  way that could, is refused (`dra.selector_reaches`), since a class without selectors of its own
  would let it pick a GPU;
- `adminAccess` only in `dra.adminNamespaces`. Kubernetes already refuses it outside namespaces
  labelled `resource.kubernetes.io/admin-access=true`; this narrows who may hold that access to
  the namespaces the settings name, so a label on a tenant namespace is not enough.

CREATE is judged, and an UPDATE that changes what is asked for (a claim's spec is immutable, a
template's is not); an UPDATE of metadata only (a controller's finalizer) is not.

A pod (or a workload's pod template) is judged by the claims it uses: each `resourceClaimName` and
`resourceClaimTemplateName` of `spec.resourceClaims` is looked up in the pod's namespace
(`Request.claims`, fetched by the webhook as it fetches ConfigMaps) and judged by the rules above,
so a claim written before the settings changed (or before the webhook judged claims) does not
carry a pod past them. A claim that does not exist yet passes: it is judged when it is written. One
that cannot be read fails closed (denied). Offline (dry-run without a cluster) the claims cannot be
seen, and the pod gets a warning, never a denial.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from policies import lookups, podspec, policy
from policies.gpu import dra


class DraClaims(policy.Validator):
    """Refuses DRA claims and claim templates, and pods using them, that reach GPUs outside what the settings allow."""

    id = "GPU011"
    summary = "DRA claims may reach GPUs only through a GPU DeviceClass granted to the namespace"
    kinds = dra.CLAIM_KINDS | podspec.SUPPORTED_KINDS

    def validate(self, context: policy.Context) -> Iterable[policy.Finding]:
        obj = context.object or context.request.object
        if obj.get("kind") in dra.CLAIM_KINDS:
            old = context.request.old_object
            if context.request.operation == "UPDATE" and old is not None and dra.claim_spec(old) == dra.claim_spec(obj):
                # Finalizers, labels, annotations: the controllers' writes (the resourceclaim
                # controller removes its finalizer from claims written before the settings
                # changed) must go through; only what a claim asks for is judged.
                return ()
            return _judge_claim(obj, context=context, prefix="")
        if not context.whole_pod:
            return ()
        wanted = sorted(lookups.claims_to_look_up(obj))
        if not wanted:
            return ()
        looked_up = context.request.claims
        if looked_up is None:
            shown = ", ".join(f"{kind} {name!r}" for kind, name in wanted)
            return [policy.Finding(detail=f"the pod uses {shown}, which cannot be judged offline", certain=False)]
        found: list[policy.Finding] = []
        for kind, name in wanted:
            claim = looked_up.get((kind, name))
            if claim is None:
                found.append(policy.Finding(detail=f"the pod uses {kind} {name!r}, which could not be read: it cannot be judged"))
                continue
            found.extend(_judge_claim(claim, context=context, prefix=f"the pod uses {kind} {name!r}: "))
        return found


def _judge_claim(obj: Mapping[str, Any], *, context: policy.Context, prefix: str) -> list[policy.Finding]:
    """GPU011's rules on one claim or template, each finding's detail after `prefix`."""
    settings = context.settings.dra
    namespace = context.namespace
    labels = context.request.namespace_labels
    found: list[policy.Finding] = []
    for request in dra.requests(dra.claim_spec(obj)):
        where = f"{prefix}request {request.name!r}"
        if request.class_name in settings.gpu_classes:
            if not settings.may_claim(request.class_name, namespace=namespace, namespace_labels=labels):
                found.append(
                    policy.Finding(
                        detail=f"{where} claims GPU DeviceClass {request.class_name!r}, which namespace {namespace!r} is "
                        f"not granted (settings dra.claims)"
                    )
                )
        else:
            reaching = [s for s in request.selectors if dra.selector_reaches(s, drivers=settings.gpu_drivers)]
            if reaching:
                found.append(
                    policy.Finding(
                        detail=f"{where} selects through DeviceClass {request.class_name!r}, which is no GPU class, with a "
                        f"selector that may pick a GPU ({reaching[0]!r}); claim GPUs through a GPU class"
                    )
                )
        if request.admin_access and namespace not in settings.admin_namespaces:
            found.append(
                policy.Finding(
                    detail=f"{where} asks for adminAccess, which namespace {namespace!r} is not an admin namespace for "
                    f"(settings dra.adminNamespaces)"
                )
            )
    return found
