"""A kubelet's mirror pods: answered allowed, unchanged and unjudged, as the registrations once skipped them.

Mirror pods are the API copies of a kubelet's static pods: the kubelet runs them whatever admission
says, so mutating or refusing them only hides what runs. The mutating webhook used to skip them with
a match condition (``not-a-mirror-pod``, still on the validating webhook and in ``vap.MIRROR_POD``),
but a webhook with match conditions makes kube-apiserver convert the whole pod for CEL on every
create, and again in the reinvocation round that our own patch triggers: answering the rare mirror
pod here is cheaper than testing every pod there.

The test is the condition's: the request is for a Pod (the condition reads
``request.resource.resource == 'pods'``; the registrations send Pods only as that resource and its
``ephemeralcontainers`` subresource, both of kind Pod), its object carries the
``kubernetes.io/config.mirror`` annotation (any value), and the request's user is a kubelet
(``system:node:<name>``). Anyone may write the annotation (the apiserver does not refuse it on
create); only the user name, which the apiserver sets from the credentials, makes it a mirror pod.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies import model
from webhook.admission import review

ANNOTATION = "kubernetes.io/config.mirror"
KUBELET_USER_PREFIX = "system:node:"
DECISION = model.Decision(
    allowed=True, exempt_reason="a kubelet's mirror pod (the kubelet runs its static pods whatever admission says)"
)


def is_kubelets_mirror_pod(checked: review.Review) -> bool:
    """Whether the review is a kubelet's own mirror pod (see the module docstring)."""
    if checked.object_kind != "Pod" or not checked.user.startswith(KUBELET_USER_PREFIX) or checked.object is None:
        return False
    metadata = checked.object.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return isinstance(annotations, Mapping) and ANNOTATION in annotations


def decision(checked: review.Review) -> model.Decision | None:
    """``DECISION`` for a kubelet's mirror pod, None for every other review (judged as always)."""
    return DECISION if is_kubelets_mirror_pod(checked) else None
