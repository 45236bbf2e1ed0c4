"""The decision cache (webhook.admission.decisioncache): with it on, every review gets exactly the
AdmissionReview it gets with it off, while replicas of one template are judged once."""

from __future__ import annotations

import argparse
import asyncio
import copy
import datetime
import importlib.util
import json
import pathlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import hypothesis
import pytest
from aiohttp import test_utils
from hypothesis import strategies as st

from policies import engine, model, settings
from tests.unit.policies.test_properties import CONFIGS, objects
from webhook.admission import app as admission_app
from webhook.admission import decisioncache, decisions, envsources, keys, namespaces

NOW = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)
GPU_LIMITS = {"limits": {"nvidia.com/gpu": 1}}
# Settings where the name, a namespace label and an expiry decide the verdict.
NAMED = settings.from_mapping(
    {"exceptions": [{"name": "exporter", "policies": ["GPU002"], "match": {"namespaces": ["team-a"], "names": ["exporter-*"]}}]}
)
LAB_WARNS = settings.from_mapping(
    {
        "namespaceOverrides": [
            {"name": "lab", "namespaceSelector": {"matchLabels": {"team": "lab"}}, "policies": {"GPU002": {"action": "warn"}}}
        ]
    }
)


def pod(name: str = "train-7d9f-abcde", **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "generateName": "train-7d9f-", "labels": {"app": "train"}},
        "spec": {"containers": [{"name": "main", "image": "trainer:1", **container}]},
    }


def review(obj: Mapping[str, Any], *, uid: str, namespace: str = "team-a", operation: str = "CREATE") -> dict[str, Any]:
    kind = str(obj.get("kind"))
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
            "name": str(obj.get("metadata", {}).get("name", "")) if isinstance(obj.get("metadata"), dict) else "",
            "namespace": namespace,
            "operation": operation,
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "groups": ["system:serviceaccounts"],
            },
            "object": obj,
            "dryRun": False,
        },
    }


def replicas(obj: Mapping[str, Any], count: int) -> Iterator[dict[str, Any]]:
    """What a controller creates from one template: the same object with its own name, uid and
    times, and (a pod, as the ServiceAccount admission plugin leaves it) its own token volume."""
    for index in range(count):
        copied = json.loads(json.dumps(obj))
        metadata = copied.get("metadata")
        if isinstance(metadata, dict):
            metadata["name"] = f"{metadata.get('name', 'app')}-{index:05d}"
            metadata["uid"] = f"00000000-0000-0000-0000-{index:012d}"
            metadata["creationTimestamp"] = f"2026-06-01T00:00:{index % 60:02d}Z"
            metadata["managedFields"] = [{"manager": "kube-controller-manager", "time": f"2026-06-01T00:00:{index % 60:02d}Z"}]
        spec = copied.get("spec")
        if copied.get("kind") == "Pod" and isinstance(spec, dict) and isinstance(spec.get("volumes", []), list):
            token = f"kube-api-access-{index:05d}"
            spec["volumes"] = [
                *spec.get("volumes", []),
                {"name": token, "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
            ]
            for container in spec.get("containers", []) if isinstance(spec.get("containers"), list) else []:
                if isinstance(container, dict) and isinstance(container.get("volumeMounts", []), list):
                    mount = {"name": token, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True}
                    container["volumeMounts"] = [*container.get("volumeMounts", []), mount]
        yield copied


class Pair:
    """Two apps under the same settings, one remembering decisions and one not."""

    def __init__(self, config: settings.Settings, **extras: Any) -> None:
        self.apps = [admission_app.make_app(config, decision_cache_entries=n) for n in (64, 0)]
        for app in self.apps:
            for key, value in extras.items():
                app[getattr(keys, key)] = value
        self.clients: list[test_utils.TestClient[Any, Any]] = []
        self.sent = 0

    async def __aenter__(self) -> Pair:
        for app in self.apps:
            client = test_utils.TestClient(test_utils.TestServer(app))
            await client.start_server()
            self.clients.append(client)
        return self

    async def __aexit__(self, *_: object) -> None:
        for client in self.clients:
            await client.close()

    @property
    def cache(self) -> decisioncache.Cache:
        return self.apps[0][keys.DECISIONS]

    def reload(self, config: settings.Settings) -> None:
        for app in self.apps:
            app[keys.LIVE_SETTINGS].current = config

    async def same(self, obj: Mapping[str, Any], **kwargs: Any) -> dict[str, dict[str, Any]]:
        """Send ``obj`` to /mutate and /validate of both apps; the answers must be equal. Returns them."""
        self.sent += 1
        body = review(obj, uid=f"uid-{self.sent}", **kwargs)
        answers = {}
        for endpoint in ("mutate", "validate"):
            on, off = [await (await c.post(f"/{endpoint}", json=body)).json() for c in self.clients]
            assert on == off, (endpoint, obj, on, off)
            assert on["response"]["uid"] == body["request"]["uid"]
            answers[endpoint] = on
        return answers


# --- every generated object, cache on and off --------------------------------------------------------


# Every built-in policy skips the first and third replica (by name) and judges the second.
BY_NAME = {
    "exceptions": [
        {"name": "x", "policies": [p.id for p in engine.POLICIES], "match": {"namespaces": ["team-a"], "names": ["app-0000[02]"]}}
    ]
}


@hypothesis.settings(max_examples=60, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(
    objs=st.lists(objects(), min_size=1, max_size=4),
    config=st.sampled_from([*CONFIGS, BY_NAME, BY_NAME]),
)
def test_generated_objects_and_their_replicas_get_the_answers_they_get_without_the_cache(
    objs: list[dict[str, Any]], config: dict[str, Any]
) -> None:
    async def run() -> None:
        async with Pair(settings.from_mapping(config)) as pair:
            for obj in objs:
                for copied in replicas(obj, 3):
                    await pair.same(copied)
            # /mutate and /validate ask once each, /validate a second time for a pod it judges as stored
            # (decisions.needs_stored); the app without a cache asked the same questions.
            asked = pair.cache.hits + pair.cache.misses + pair.cache.bypassed
            assert asked == pair.apps[1][keys.DECISIONS].bypassed and asked >= 2 * 3 * len(objs)

    asyncio.run(run())


def test_replicas_are_judged_once_and_keep_their_own_uid() -> None:
    async def run() -> None:
        async with Pair(settings.Settings()) as pair:
            denied = pod(securityContext={"privileged": True}, resources=GPU_LIMITS)
            for copied in replicas(denied, 5):
                answers = await pair.same(copied)
                assert answers["validate"]["response"]["allowed"] is False
            assert (pair.cache.misses, pair.cache.hits) == (1, 9)  # /mutate and /validate share the entry
            patched = pod(resources={"limits": {"aliyun.com/gpu-mem": 3}})
            patches = {(await pair.same(c))["mutate"]["response"]["patch"] for c in replicas(patched, 3)}
            # a second miss for /validate's question as stored (the same pod, unpatched, posted there)
            assert len(patches) == 1 and pair.cache.misses == 3

    asyncio.run(run())


def test_a_decision_that_names_the_pod_is_not_kept() -> None:
    async def run() -> None:
        async with Pair(settings.Settings()) as pair:
            for index in range(2):
                name = f"exporter-{index}"
                named = pod(
                    name, volumeMounts=[{"name": name, "mountPath": "/host-dev"}], resources={"limits": {"nvidia.com/gpu": 1}}
                )
                named["spec"]["volumes"] = [{"name": name, "hostPath": {"path": "/dev"}}]
                answer = (await pair.same(named))["validate"]["response"]
                assert answer["allowed"] is False and name in answer["status"]["message"]
            assert (pair.cache.misses, pair.cache.hits, len(pair.cache)) == (4, 0, 0)

    asyncio.run(run())


def test_a_settings_reload_is_never_answered_from_the_old_settings() -> None:
    async def run() -> None:
        async with Pair(settings.Settings()) as pair:
            privileged = pod(securityContext={"privileged": True}, resources=GPU_LIMITS)
            assert (await pair.same(privileged))["validate"]["response"]["allowed"] is False
            pair.reload(settings.from_mapping({"policies": {"GPU002": {"action": "warn"}}}))
            answer = (await pair.same(privileged))["validate"]["response"]
            assert answer["allowed"] is True and any("GPU002" in w for w in answer["warnings"])
            assert len(pair.cache) == 1  # the entry from before the reload is gone

    asyncio.run(run())


def test_a_namespace_label_change_changes_the_answer() -> None:
    async def run() -> None:
        informer = namespaces.Informer(source=None)  # type: ignore[arg-type]  # never started: labels are set by hand
        informer.labels.replace([{"metadata": {"name": "team-a", "labels": {"team": "lab"}}}], resource_version="1")
        async with Pair(LAB_WARNS, NAMESPACES=informer) as pair:
            privileged = pod(securityContext={"privileged": True}, resources=GPU_LIMITS)
            assert (await pair.same(privileged))["validate"]["response"]["allowed"] is True
            informer.labels.apply(
                {"type": "MODIFIED", "object": {"metadata": {"name": "team-a", "resourceVersion": "2", "labels": {}}}}
            )
            assert (await pair.same(privileged))["validate"]["response"]["allowed"] is False
            assert (pair.cache.misses, pair.cache.hits) == (2, 2)  # each /validate reused its /mutate's entry

    asyncio.run(run())


def test_a_changed_config_map_changes_the_answer() -> None:
    async def run() -> None:
        data: dict[str, dict[str, str]] = {"settings": {"LOG_LEVEL": "debug"}}
        env = envsources.Cache(lambda source: dict(data[source.name]), ttl_s=0)
        async with Pair(settings.Settings(), ENV_SOURCES=env) as pair:
            reader = pod(resources=GPU_LIMITS, envFrom=[{"configMapRef": {"name": "settings"}}])
            assert (await pair.same(reader))["validate"]["response"]["allowed"] is True
            assert (await pair.same(reader))["validate"]["response"]["allowed"] is True
            data["settings"] = {"NVIDIA_VISIBLE_DEVICES": "all"}
            answer = (await pair.same(reader))["validate"]["response"]
            assert answer["allowed"] is False and "GPU001" in answer["status"]["message"]
            assert pair.cache.hits >= 1

    asyncio.run(run())


def test_an_exception_by_name_keeps_names_in_the_key() -> None:
    async def run() -> None:
        async with Pair(NAMED) as pair:
            exporter = pod("exporter-1", securityContext={"privileged": True}, resources=GPU_LIMITS)
            other = pod("trainer-1", securityContext={"privileged": True}, resources=GPU_LIMITS)
            assert (await pair.same(exporter))["validate"]["response"]["allowed"] is True
            assert (await pair.same(other))["validate"]["response"]["allowed"] is False

    asyncio.run(run())


# --- the cache alone ---------------------------------------------------------------------------------


def decide(
    cache: decisioncache.Cache,
    obj: Mapping[str, Any],
    config: settings.Settings,
    *,
    now: datetime.datetime = NOW,
    **overrides: Any,
) -> model.Decision:
    env_sources = overrides.pop("env_sources", ())
    question = decisions.Question(object=obj, namespace="team-a", user="u", now=now, **overrides)
    return cache.decide(question, settings=config, env_sources=env_sources)


def test_an_entry_lives_until_the_next_exception_expiry() -> None:
    expiring = settings.from_mapping(
        {
            "exceptions": [
                {
                    "name": "until-june-2",
                    "policies": ["GPU002"],
                    "match": {"namespaces": ["team-a"]},
                    "expires": "2026-06-02T00:00:00Z",
                }
            ]
        }
    )
    cache = decisioncache.Cache()
    privileged = pod(securityContext={"privileged": True}, resources=GPU_LIMITS)
    assert decide(cache, privileged, expiring).allowed
    assert decide(cache, privileged, expiring, now=NOW + datetime.timedelta(hours=23)).allowed and cache.hits == 1
    after = decide(cache, privileged, expiring, now=NOW + datetime.timedelta(days=1))
    assert not after.allowed and cache.misses == 2


def test_updates_subresources_user_policies_and_config_maps_are_never_cached() -> None:
    cache = decisioncache.Cache()
    plain = pod(resources=GPU_LIMITS)
    decide(cache, plain, settings.Settings(), operation="UPDATE", old_object=plain)
    decide(cache, plain, settings.Settings(), subresource="ephemeralcontainers", old_object=plain)
    decide(cache, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}}, settings.Settings())
    decide(cache, plain, settings.Settings(), node_labels={"a": "b"})
    assert (cache.bypassed, cache.hits, cache.misses, len(cache)) == (4, 0, 0, 0)


def test_looked_up_data_json_cannot_hold_is_judged_without_the_cache() -> None:
    cache, config = decisioncache.Cache(), settings.Settings()
    source = model.EnvSource(kind="ConfigMap", namespace="team-a", name="odd")
    reader = pod(resources=GPU_LIMITS, envFrom=[{"configMapRef": {"name": "odd"}}])
    odd: Any = {"KEY": b"bytes, not text"}
    decision = decide(cache, reader, config, env_lookup=lambda s: odd if s == source else None, env_sources=(source,))
    assert (cache.bypassed, len(cache)) == (1, 0)
    assert decision == decide(
        decisioncache.Cache(max_entries=0), reader, config, env_lookup=lambda s: odd if s == source else None
    )


def test_the_least_recently_used_entry_goes_first() -> None:
    outcomes: list[str] = []
    cache, config = decisioncache.Cache(max_entries=2, on_outcome=outcomes.append), settings.Settings()
    first, second, third = (pod(image=f"trainer:{n}") for n in (1, 2, 3))
    for obj in (first, second, first, third, first, second):
        decide(cache, obj, config)
    # `second` was least recently used when `third` came, so it is computed again at the end.
    assert outcomes == ["miss", "miss", "hit", "miss", "hit", "miss"] and len(cache) == 2


def test_zero_entries_switch_the_cache_off() -> None:
    cache, config = decisioncache.Cache(max_entries=0), settings.Settings()
    for copied in replicas(pod(), 2):
        decide(cache, copied, config)
    assert (cache.bypassed, len(cache)) == (2, 0)


def test_a_different_key_order_is_a_miss_not_a_wrong_answer() -> None:
    cache, config = decisioncache.Cache(), settings.Settings()
    obj = pod(resources=GPU_LIMITS)
    reordered = {k: copy.deepcopy(obj[k]) for k in reversed(list(obj))}
    assert decide(cache, obj, config) == decide(cache, reordered, config)
    assert (cache.misses, cache.hits) == (2, 0)
    assert decide(cache, reordered, config) == decide(cache, obj, config) and cache.hits == 2


def test_the_metrics_count_hits_misses_and_bypasses() -> None:
    async def run() -> None:
        app = admission_app.make_app(settings.Settings(), decision_cache_entries=8)
        async with test_utils.TestClient(test_utils.TestServer(app)) as client:
            for copied in replicas(pod(resources=GPU_LIMITS), 2):
                await client.post("/validate", json=review(copied, uid="u"))
            await client.post("/validate", json=review(pod(), uid="u", operation="UPDATE"))
            text = await (await client.get("/metrics")).text()
        for outcome in ("hit", "miss", "bypass"):
            assert f'gpu_admission_decision_cache_total{{result="{outcome}"}} 1.0' in text, text

    asyncio.run(run())


def test_the_entry_count_is_serves_flag_and_zero_turns_the_cache_off(capsys: pytest.CaptureFixture[str]) -> None:
    from webhook import cli

    parser = cli.make_parser(("webhook.commands.serve",))
    base = ["serve", "--tls-cert-file", "c", "--tls-private-key-file", "k"]
    assert parser.parse_args(base).decision_cache_entries == decisioncache.DEFAULT_MAX_ENTRIES
    assert parser.parse_args([*base, "--decision-cache-entries", "0"]).decision_cache_entries == 0
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args([*base, "--decision-cache-entries", "-1"])
    assert exit_info.value.code == 2 and "must be 0 or more" in capsys.readouterr().err
    assert admission_app.make_app(settings.Settings(), decision_cache_entries=0)[keys.DECISIONS].max_entries == 0
    assert admission_app.make_app(settings.Settings())[keys.DECISIONS].max_entries == decisioncache.DEFAULT_MAX_ENTRIES


# --- the bench's cluster-shaped stream ----------------------------------------------------------------


def test_the_bench_stream_hits_on_replicas_only_and_every_answer_matches_the_engine() -> None:
    """bench/replica_stream.py's pods as the apiserver hands them over (token volume, defaults):
    Deployment and Job replicas hit, pods unique by design never do, and no cached decision differs
    from the engine's own."""
    spec = importlib.util.spec_from_file_location(
        "replica_stream", pathlib.Path(__file__).parents[3] / "bench" / "replica_stream.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("replica_stream", bench)  # dataclasses look their module up there
    spec.loader.exec_module(bench)
    args = argparse.Namespace(
        seed=3,
        deployments=6,
        jobs=4,
        indexed_share=0.5,
        statefulsets=2,
        daemonsets=1,
        nodes=4,
        bare=5,
        namespaces=2,
        horizon_s=60.0,
    )
    config, cache = settings.Settings(), decisioncache.Cache()
    hits: dict[str, int] = {}
    for create in bench.stream(args):
        question = decisions.Question(object=create.pod, namespace=create.namespace, user="u", now=NOW)
        before = cache.hits
        cached = cache.decide(question, settings=config)
        assert cached == decisions.answer(question, settings=config)
        hits[create.source] = hits.get(create.source, 0) + cache.hits - before
    assert hits["deployment"] > 0 and hits["job"] > 0
    assert all(hits.get(source, 0) == 0 for source in ("bare", "daemonset", "indexed-job", "statefulset")), hits
