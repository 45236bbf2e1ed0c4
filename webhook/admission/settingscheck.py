"""`/validate-settings`: a settings ConfigMap that would not load is refused where it is written.

The webhook (and the extender, and the labeler) read their settings from the ConfigMap
`gpu-admission-policy` (key `config.yaml`) mounted as a file. A bad edit used to be found only at
the next load, where it is logged and the last good settings stay in force: the edit looked
accepted. The registration (deploy/webhook-configurations.yaml, `validate-settings.gpu-admission.io`)
sends this endpoint creates and updates of that one ConfigMap, and it refuses, with the same one
line the load would log:

- YAML that does not parse, a document the settings refuse (`policies.settings.from_mapping`, with
  the user policies now loaded, so their IDs may be named);
- a GPU budget (`gpuBudgets`) whose namespaceSelector selects no namespace that exists (issue 36:
  almost always a typo, and a budget that keeps nothing). Where the webhook has no namespace list,
  this part is skipped with a warning; a budget naming namespaces that do not exist (yet) is
  allowed with a warning, since a namespace is often created after its budget.

The registration's failurePolicy is Ignore, on purpose: the webhook must never stand between an
operator and the repair of its own settings. While it is down, a bad edit goes through and is
refused at load as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import yaml
from aiohttp import web

from policies import policy, settings
from webhook.admission import jsoncodec, keys, response, review
from webhook.config import yaml_reason

log = logging.getLogger(__name__)

CONFIGMAP = "gpu-admission-policy"
KEY = "config.yaml"


def judge(
    obj: Mapping[str, Any] | None,
    *,
    user_policies: Iterable[policy.Policy] = (),
    namespaces: Mapping[str, Mapping[str, str]] | None = None,
) -> tuple[str, list[str]]:
    """Why the ConfigMap is refused ("" when it is allowed), and the warnings to give."""
    data = obj.get("data") if isinstance(obj, Mapping) else None
    text = data.get(KEY) if isinstance(data, Mapping) else None
    if not isinstance(text, str):
        return f"data.{KEY}: missing; the webhook, the extender and the labeler read their settings from it", []
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        return f"data.{KEY}: invalid YAML: {yaml_reason(error)}", []
    if document is not None and not isinstance(document, Mapping):
        return f"data.{KEY}: the settings must be a mapping, not {type(document).__name__}", []
    try:
        loaded = settings.from_mapping(document, user_policies=user_policies)
    except settings.InvalidSettings as error:
        return f"data.{KEY}: {error}", []
    if not loaded.gpu_budgets:
        return "", []
    if namespaces is None:
        return "", ["the webhook has no namespace list: whether each GPU budget selects a namespace was not checked"]
    warnings: list[str] = []
    for index, budget in enumerate(loaded.gpu_budgets):
        selected = [
            name for name, labels in namespaces.items() if budget.match.matches(name, settings.labels_of_namespace(name, labels))
        ]
        if selected:
            continue
        where = f"data.{KEY}: gpuBudgets[{index}]"
        if budget.match.selector is not None:
            return f"{where}: budget {budget.name!r} selects no namespace that exists; check its namespaceSelector", []
        warnings.append(
            f"{where}: budget {budget.name!r} names no namespace that exists yet: {', '.join(sorted(budget.match.names))}"
        )
    return "", warnings


async def validate_settings(request: web.Request) -> web.Response:
    """The AdmissionReview answer for a write of the settings ConfigMap."""
    try:
        checked = review.parse(await request.read())
    except review.BadReview as error:
        return web.Response(status=400, text=f"bad AdmissionReview: {error}\n")
    informer = request.app.get(keys.NAMESPACES)
    namespaces = informer.labels.snapshot() if informer is not None and informer.labels.synced else None
    live = request.app[keys.LIVE_SETTINGS].current if keys.LIVE_SETTINGS in request.app else request.app[keys.SETTINGS]
    why, warnings = "", list[str]()
    if checked.operation in ("CREATE", "UPDATE") and checked.name == CONFIGMAP:
        why, warnings = judge(checked.object, user_policies=live.user_policies, namespaces=namespaces)
    if why:
        log.warning(
            "uid=%s settings ConfigMap %s/%s by %s refused: %s", checked.uid, checked.namespace, checked.name, checked.user, why
        )
    answer = response.for_verdict(request=checked, why=why, warnings=warnings)
    return web.Response(body=jsoncodec.dumps(answer), content_type="application/json", charset="utf-8")
