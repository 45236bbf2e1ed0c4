"""GPU011's claim lookups in the live webhook: only pods that name claims read them, the reads are
cached, a claim that cannot be read fails closed, one that does not exist yet passes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from policies import settings
from tests import dra_objects
from tests.conftest import ReviewFactory
from webhook.admission import app as admission_app
from webhook.admission import claims, keys

GPU_CLAIM = dra_objects.claim("gpu", namespace="team-a")


class Reader:
    """A fake claim reader that counts its reads: (namespace, kind, name) -> object; missing: {}."""

    def __init__(self, objects: Mapping[tuple[str, str, str], Mapping[str, Any]], *, fail: bool = False) -> None:
        self.objects = objects
        self.fail = fail
        self.reads: list[tuple[str, str, str]] = []

    def __call__(self, key: tuple[str, str, str]) -> Mapping[str, Any]:
        self.reads.append(key)
        if self.fail:
            raise OSError("connection refused")
        return self.objects.get(key, {})


def using(**ref: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "app", "namespace": "team-a"},
        "spec": {
            "containers": [{"name": "main", "image": "app:1", "resources": {"claims": [{"name": "c"}]}}],
            "resourceClaims": [{"name": "c", **ref}],
        },
    }


def app_with(cache: claims.Cache | None) -> Any:
    app = admission_app.make_app(settings.Settings())
    if cache is not None:
        app[keys.CLAIMS] = cache
    return app


async def validate(client: Any, make_review: ReviewFactory, pod: dict[str, Any]) -> dict[str, Any]:
    answered: dict[str, dict[str, Any]] = await (await client.post("/validate", json=make_review(pod))).json()
    return answered["response"]


async def test_a_pod_naming_a_gpu_claim_of_a_tenant_is_refused_and_the_read_cached(
    aiohttp_client: Callable[..., Any], make_review: ReviewFactory
) -> None:
    reader = Reader({("team-a", "ResourceClaim", "gpu"): GPU_CLAIM})
    client = await aiohttp_client(app_with(claims.Cache(reader)))
    first = await validate(client, make_review, using(resourceClaimName="gpu"))
    second = await validate(client, make_review, using(resourceClaimName="gpu"))
    assert first["allowed"] is False and first["status"]["message"].startswith("GPU011: ")
    assert "the pod uses ResourceClaim 'gpu'" in first["status"]["message"]
    assert second["allowed"] is False
    assert reader.reads == [("team-a", "ResourceClaim", "gpu")]


async def test_a_claim_that_does_not_exist_yet_passes(aiohttp_client: Callable[..., Any], make_review: ReviewFactory) -> None:
    client = await aiohttp_client(app_with(claims.Cache(Reader({}))))
    assert (await validate(client, make_review, using(resourceClaimTemplateName="later")))["allowed"] is True


async def test_a_failed_read_fails_closed(aiohttp_client: Callable[..., Any], make_review: ReviewFactory) -> None:
    client = await aiohttp_client(app_with(claims.Cache(Reader({}, fail=True))))
    answer = await validate(client, make_review, using(resourceClaimName="gpu"))
    assert answer["allowed"] is False and "could not be read" in answer["status"]["message"]


async def test_pods_without_claims_read_nothing(aiohttp_client: Callable[..., Any], make_review: ReviewFactory) -> None:
    reader = Reader({})
    client = await aiohttp_client(app_with(claims.Cache(reader)))
    plain = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "app", "namespace": "team-a"},
        "spec": {"containers": [{"name": "main", "image": "app:1"}]},
    }
    assert (await validate(client, make_review, plain))["allowed"] is True
    assert reader.reads == []


async def test_without_lookups_a_pod_using_a_claim_gets_a_warning(
    aiohttp_client: Callable[..., Any], make_review: ReviewFactory
) -> None:
    client = await aiohttp_client(app_with(None))
    answer = await validate(client, make_review, using(resourceClaimName="gpu"))
    assert answer["allowed"] is True and any("cannot be judged offline" in w for w in answer.get("warnings", []))
