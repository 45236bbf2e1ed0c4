"""`/validate-eviction`: the labeler may evict only pods bound to its own node.

The labeler's usage limits (`usageLimits` mode `evict`, deploy/components/usage-limits) give its
ServiceAccount `create` on `pods/eviction`, cluster-wide: RBAC cannot name "the pods of your own
node". The node guard (deploy/node-guard.yaml) binds the labeler's Node writes with a
ValidatingAdmissionPolicy that compares the Node's name with the node claim of the labeler's
token (`request.userInfo.extra["authentication.kubernetes.io/node-name"]`, which the apiserver
takes from the pod the token is bound to). That cannot work for evictions: the object a
`pods/eviction` CREATE is admitted with is the Eviction (name, namespace, deleteOptions), not the
pod, and a ValidatingAdmissionPolicy cannot read another object. This endpoint can: for the
labeler's ServiceAccount only (the registration's matchConditions), it reads the pod and allows
the eviction only when the pod's `spec.nodeName` is the token's node claim. A token without the
claim, a pod on another node, and a pod that cannot be read are refused (fail closed; the
registration's failurePolicy is Fail too, so a webhook that is down refuses the labeler's
evictions, which the labeler reports and retries). A pod that does not exist is allowed: the
eviction then answers 404 itself. Anyone else's eviction is allowed unjudged (the registration
does not send them; this is the second line).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from webhook.admission import jsoncodec, keys, response, review

log = logging.getLogger(__name__)

LABELER_USER = "system:serviceaccount:gpu-admission:gpu-admission-labeler"
NODE_CLAIM = "authentication.kubernetes.io/node-name"

PodNode = Callable[[str, str], "str | None"]  # (namespace, name) -> spec.nodeName ("" unbound), None: no such pod


def judge(*, user: str, extra: Mapping[str, Any], namespace: str, name: str, pod_node: PodNode | None) -> str:
    """Why the eviction is refused; "" when it is allowed."""
    if user != LABELER_USER:
        return ""
    claim = _claim(extra)
    if not claim:
        return f"{LABELER_USER} may evict only with a token bound to a pod on a node (no {NODE_CLAIM} claim)"
    if pod_node is None:
        return "the webhook has no cluster access to read the pod, so it cannot tell the pod's node"
    try:
        node = pod_node(namespace, name)
    except Exception as error:  # noqa: BLE001 - any failure to read the pod refuses (fail closed)
        return f"reading pod {namespace}/{name} failed ({str(error).splitlines()[0] if str(error) else type(error).__name__})"
    if node is None:
        return ""  # no such pod: the eviction answers 404 itself
    if node != claim:
        return f"pod {namespace}/{name} runs on node {node or '(none)'}, not on {claim}, the node of the labeler's token"
    return ""


def _claim(extra: Mapping[str, Any]) -> str:
    values = extra.get(NODE_CLAIM)
    if isinstance(values, Sequence) and not isinstance(values, str) and len(values) == 1 and isinstance(values[0], str):
        return values[0]
    return ""


async def validate_eviction(request: web.Request) -> web.Response:
    """The AdmissionReview answer for a `pods/eviction` CREATE."""
    body = await request.read()
    try:
        checked = review.parse(body)
    except review.BadReview as error:
        return web.Response(status=400, text=f"bad AdmissionReview: {error}\n")
    data = json.loads(body)  # parse() has read it: a JSON object with a request mapping
    user_info = data["request"].get("userInfo")
    extra = user_info.get("extra") if isinstance(user_info, dict) else None
    pod_node = request.app.get(keys.POD_NODES)
    why = await asyncio.to_thread(
        judge,
        user=checked.user,
        extra=extra if isinstance(extra, dict) else {},
        namespace=checked.namespace,
        name=checked.name,
        pod_node=pod_node,
    )
    if why:
        log.warning(
            "uid=%s eviction of pod %s/%s by %s refused: %s", checked.uid, checked.namespace, checked.name, checked.user, why
        )
    answer = response.for_verdict(request=checked, why=why)
    return web.Response(body=jsoncodec.dumps(answer), content_type="application/json", charset="utf-8")
