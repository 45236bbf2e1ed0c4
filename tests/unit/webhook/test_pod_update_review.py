"""Pod UPDATE reviews over real TLS: /validate refuses a forged allocation annotation (GPU008) and
admits an ordinary update; /mutate never patches an update of the pod itself."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

Factory = Callable[..., Any]

BOUND = {"ALIYUN_COM_GPU_MEM_IDX": "1", "ALIYUN_COM_GPU_MEM_POD": "4", "ALIYUN_COM_GPU_MEM_ASSIGNED": "false"}


async def _post(client: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with client.post(path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}) as answer:
        assert answer.status == 200
        found: dict[str, Any] = json.loads(await answer.text())
        return found


def _bound(make_pod: Factory) -> dict[str, Any]:
    pod: dict[str, Any] = make_pod(
        limits={"aliyun.com/gpu-mem": 4}, annotations=BOUND, node_selector={"ack.node.gpu.schedule": "cgpu"}
    )
    pod["spec"]["nodeName"] = "gpu-0"
    return pod


async def test_a_forged_annotation_update_is_refused_with_403_naming_gpu008(
    webhook_client: Factory, make_review: Factory, make_pod: Factory
) -> None:
    client = await webhook_client()
    old = _bound(make_pod)
    new = copy.deepcopy(old)
    new["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_IDX"] = "0"

    answer = await _post(client, "/validate", make_review(new, operation="UPDATE", old_object=old))

    response = answer["response"]
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert response["status"]["message"].startswith("GPU008: ")
    assert "the update changes ALIYUN_COM_GPU_MEM_IDX" in response["status"]["message"]


async def test_an_ordinary_update_is_admitted_and_never_patched(
    webhook_client: Factory, make_review: Factory, make_pod: Factory
) -> None:
    client = await webhook_client()
    # A pod that would get GPU101/GPU104 additions at create: on update nobody patches it.
    old = make_pod(limits={"aliyun.com/gpu-mem": 4}, annotations=BOUND)
    old["spec"]["nodeName"] = "gpu-0"
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"team": "b"}
    review = make_review(new, operation="UPDATE", old_object=old)

    for path in ("/validate", "/mutate"):
        response = (await _post(client, path, review))["response"]
        assert response["allowed"] is True, response
        assert "patch" not in response and "warnings" not in response


async def test_a_pod_update_reads_no_config_map_but_a_create_does(
    aiohttp_client: Factory, make_review: Factory, make_pod: Factory
) -> None:
    from policies import settings
    from webhook.admission import app as admission_app
    from webhook.admission import envsources, keys

    reads: list[str] = []

    def reader(source: Any) -> dict[str, str]:
        reads.append(source.name)
        return {"LOG_LEVEL": "debug"}

    app = admission_app.make_app(settings.Settings())
    app[keys.ENV_SOURCES] = envsources.Cache(reader)
    client = await aiohttp_client(app)
    old = _bound(make_pod)
    old["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "app-env"}}]
    new = copy.deepcopy(old)
    new["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_IDX"] = "0"

    answered = await (await client.post("/validate", json=make_review(new, operation="UPDATE", old_object=old))).json()
    assert answered["response"]["allowed"] is False and reads == []
    created = copy.deepcopy(old)  # the same pod as a tenant creates it: no node, no allocation yet
    del created["metadata"]["annotations"], created["spec"]["nodeName"]
    answered = await (await client.post("/validate", json=make_review(created))).json()
    assert answered["response"]["allowed"] is True and reads == ["app-env"]
