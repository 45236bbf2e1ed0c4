"""A stream of pod CREATE reviews shaped like a cluster's, and the decision cache's hit rate on it.

What it models: the pods kube-apiserver asks the webhook about over a busy stretch of a shared GPU
cluster, as the webhook receives them (after the apiserver's defaulting and its built-in admission
plugins: the ServiceAccount token volume ``kube-api-access-<5 random>`` in every pod, the default
tolerations, terminationMessagePath, ...), created by:

- **Deployments** (``--deployments``, default 120, a third with a GPU): each event is a scale-up
  (1-20 pods), a rollout (a new ReplicaSet: new ``pod-template-hash``, every replica again) or one
  pod replaced after an eviction; a ReplicaSet creates in slow-start batches (1, 2, 4, 8, ...).
  Replicas differ only in name, uid, times and the token volume's name;
- **Jobs** (non-indexed): completions 1-100, the pods share the Job's ``controller-uid`` label;
  every Job (a CronJob's run too) is a new template;
- **Indexed Jobs**: each pod carries its completion index (label, annotation, hostname): unique;
- **StatefulSets**: each pod carries its own ``pod-name`` and ``pod-index`` labels and hostname: unique;
- **DaemonSets**: each pod is pinned to its node by a ``matchFields`` affinity term: unique;
- **bare pods** (notebooks, ``kubectl run``, debug pods): unique.

Controllers start at random times and their batches interleave (sorted by time), so the cache sees
other controllers' pods between two replicas of one. ``--seed`` fixes the stream.

For each cache size it prints the hit rate (overall and per source), then the engine's CPU per
review over the whole stream with and without the cache (``time.process_time``, in-process: no
HTTP, no TLS, so the review's own parse and response are not in it), and what a miss costs on top
(the key). The last line is JSON.

    .venv/bin/python bench/replica_stream.py                    # about 4,900 creates
    .venv/bin/python bench/replica_stream.py --deployments 40 --sizes 64,1024
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import json
import pathlib
import random
import string
import sys
import time
from collections.abc import Iterator
from typing import Any

from policies import settings
from webhook.admission import decisioncache, decisions

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # bench/ itself, also when imported by a test
import records  # noqa: E402 - one record per run


@dataclasses.dataclass(frozen=True)
class Create:
    """One pod CREATE: the pod, its namespace, the time it is sent (s) and what made it."""

    at: float
    source: str
    namespace: str
    pod: dict[str, Any]


def _suffix(rng: random.Random, n: int = 5) -> str:
    return "".join(rng.choices(string.ascii_lowercase + string.digits, k=n))


def template(rng: random.Random, *, name: str, gpu: bool) -> dict[str, Any]:
    """A pod template (labels, annotations, spec) as a workload declares it."""
    container: dict[str, Any] = {
        "name": "main",
        "image": f"registry.example/{name}:{rng.randint(1, 40)}.{rng.randint(0, 9)}",
        "args": [f"--config=/etc/{name}/config.yaml"],
        "env": [{"name": f"SETTING_{i}", "value": _suffix(rng, 8)} for i in range(rng.randint(2, 12))],
        "resources": {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "1", "memory": "2Gi"}},
        "ports": [{"containerPort": 8080, "protocol": "TCP"}],
    }
    if gpu:
        key, value = rng.choice([("aliyun.com/gpu-mem", rng.choice([4, 8, 16])), ("nvidia.com/gpu", rng.choice([1, 2, 8]))])
        container["resources"]["limits"][key] = value
    return {
        "labels": {"app": name, "team": rng.choice(["ml", "search", "ads", "infra"])},
        "annotations": {"prometheus.io/scrape": "true"} if rng.random() < 0.5 else {},
        "spec": {"containers": [container], "serviceAccountName": "default"},
    }


def pod(
    rng: random.Random,
    tpl: dict[str, Any],
    *,
    namespace: str,
    generate_name: str,
    at: float,
    owner: tuple[str, str, str] | None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    spec_extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The pod as the webhook sees it: the template plus what the controller and apiserver add."""
    spec = json.loads(json.dumps(tpl["spec"]))
    token = f"kube-api-access-{_suffix(rng)}"
    for container in spec["containers"]:
        container.update(
            terminationMessagePath="/dev/termination-log", terminationMessagePolicy="File", imagePullPolicy="IfNotPresent"
        )
        container["volumeMounts"] = [
            {"name": token, "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
        ]
    spec.update(
        restartPolicy="Always",
        terminationGracePeriodSeconds=30,
        dnsPolicy="ClusterFirst",
        securityContext={},
        schedulerName="default-scheduler",
        enableServiceLinks=True,
        preemptionPolicy="PreemptLowerPriority",
        priority=0,
        tolerations=[
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        ],
        volumes=[
            {
                "name": token,
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    ],
                },
            }
        ],
    )
    spec.update(spec_extra or {})
    stamp = (datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC) + datetime.timedelta(seconds=at)).strftime("%Y-%m-%dT%H:%M:%SZ")
    metadata: dict[str, Any] = {
        "name": generate_name + _suffix(rng),
        "generateName": generate_name,
        "namespace": namespace,
        "uid": f"{rng.getrandbits(128):032x}",
        "creationTimestamp": stamp,
        "labels": {**tpl["labels"], **(labels or {})},
        "managedFields": [
            {
                "manager": "kube-controller-manager",
                "operation": "Update",
                "apiVersion": "v1",
                "time": stamp,
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:generateName": {}}},
            }
        ],
    }
    if tpl["annotations"] or annotations:
        metadata["annotations"] = {**tpl["annotations"], **(annotations or {})}
    if owner is not None:
        kind, name, uid = owner
        metadata["ownerReferences"] = [
            {
                "apiVersion": "apps/v1" if kind != "Job" else "batch/v1",
                "kind": kind,
                "name": name,
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _batches(count: int) -> Iterator[int]:
    """A controller's slow start: 1, 2, 4, ... pods per batch until ``count``."""
    size = 1
    while count > 0:
        yield min(size, count)
        count -= size
        size *= 2


def stream(args: argparse.Namespace) -> list[Create]:
    rng = random.Random(args.seed)
    namespaces = [f"team-{i}" for i in range(args.namespaces)]
    creates: list[Create] = []

    def burst(source: str, start: float, count: int, make: Any) -> None:
        at, index = start, 0
        for size in _batches(count):
            for _ in range(size):
                creates.append(Create(at=at + rng.random() * 0.2, source=source, namespace=make.namespace, pod=make(index, at)))
                index += 1
            at += 0.5

    class Maker:
        def __init__(
            self, namespace: str, tpl: dict[str, Any], generate_name: str, owner: tuple[str, str, str] | None, per_pod: Any = None
        ) -> None:
            self.namespace, self.tpl, self.generate_name, self.owner, self.per_pod = namespace, tpl, generate_name, owner, per_pod

        def __call__(self, index: int, at: float) -> dict[str, Any]:
            extra = self.per_pod(index) if self.per_pod else {}
            return pod(
                rng, self.tpl, namespace=self.namespace, generate_name=self.generate_name, at=at, owner=self.owner, **extra
            )

    horizon = args.horizon_s
    for d in range(args.deployments):
        name, namespace = f"deploy-{d}", rng.choice(namespaces)
        tpl = template(rng, name=name, gpu=rng.random() < 1 / 3)
        replicas = rng.choice([1, 2, 3, 3, 5, 8, 10, 20])
        hash_ = _suffix(rng, 10)
        for event in range(rng.randint(1, 6)):
            start = rng.random() * horizon
            kind = rng.choices(["scale", "rollout", "evict"], weights=[3, 2, 3])[0]
            if kind == "rollout" or event == 0:
                hash_ = _suffix(rng, 10)
                tpl = {**tpl, "annotations": {**tpl["annotations"], "kubectl.kubernetes.io/restartedAt": f"{start:.0f}"}}
                count = replicas
            else:
                count = rng.randint(1, 20) if kind == "scale" else 1
            rs = f"{name}-{hash_}"
            labeled = {**tpl, "labels": {**tpl["labels"], "pod-template-hash": hash_}}
            burst("deployment", start, count, Maker(namespace, labeled, rs + "-", ("ReplicaSet", rs, f"rs-{rs}")))
    for j in range(args.jobs):
        name, namespace = f"job-{j}-{_suffix(rng)}", rng.choice(namespaces)
        uid = f"{rng.getrandbits(128):032x}"
        tpl = template(rng, name=name, gpu=rng.random() < 0.5)
        tpl["labels"] = {
            **tpl["labels"],
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": name,
            "controller-uid": uid,
            "job-name": name,
        }
        tpl["spec"]["restartPolicy"] = "Never"
        indexed = rng.random() < args.indexed_share
        count = rng.choice([1, 2, 5, 10, 20, 50, 100]) if not indexed else rng.choice([4, 8, 16])

        def per_index(index: int, name: str = name) -> dict[str, Any]:
            return {
                "labels": {"batch.kubernetes.io/job-completion-index": str(index)},
                "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
                "spec_extra": {"hostname": f"{name}-{index}", "subdomain": name},
            }

        burst(
            "indexed-job" if indexed else "job",
            rng.random() * horizon,
            count,
            Maker(namespace, tpl, name + "-", ("Job", name, uid), per_index if indexed else None),
        )
    for s in range(args.statefulsets):
        name, namespace = f"sts-{s}", rng.choice(namespaces)
        tpl = template(rng, name=name, gpu=rng.random() < 0.3)

        def per_ordinal(index: int, name: str = name) -> dict[str, Any]:
            return {
                "labels": {"statefulset.kubernetes.io/pod-name": f"{name}-{index}", "apps.kubernetes.io/pod-index": str(index)},
                "spec_extra": {"hostname": f"{name}-{index}", "subdomain": name},
            }

        burst(
            "statefulset",
            rng.random() * horizon,
            rng.choice([1, 3, 5]),
            Maker(namespace, tpl, "", ("StatefulSet", name, f"sts-{name}"), per_ordinal),
        )
    for d in range(args.daemonsets):
        name = f"ds-{d}"
        tpl = template(rng, name=name, gpu=False)

        def per_node(index: int) -> dict[str, Any]:
            term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [f"node-{index}"]}]}
            return {
                "spec_extra": {
                    "affinity": {
                        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
                    }
                }
            }

        burst(
            "daemonset",
            rng.random() * horizon,
            args.nodes,
            Maker("kube-system" if d % 2 else "monitoring", tpl, name + "-", ("DaemonSet", name, f"ds-{name}"), per_node),
        )
    for b in range(args.bare):
        name = f"bare-{b}"
        tpl = template(rng, name=name, gpu=rng.random() < 0.4)
        tpl["spec"]["containers"][0]["args"] = [f"--notebook={_suffix(rng, 12)}"]
        burst("bare", rng.random() * horizon, 1, Maker(rng.choice(namespaces), tpl, name + "-", None))
    creates.sort(key=lambda c: c.at)
    return creates


def _decide(cache: decisioncache.Cache | None, create: Create, config: settings.Settings) -> None:
    question = decisions.Question(
        object=create.pod,
        namespace=create.namespace,
        user="system:serviceaccount:kube-system:controller",
        groups=("system:serviceaccounts",),
    )
    if cache is None:
        decisions.answer(question, settings=config)
    else:
        cache.decide(question, settings=config)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--deployments", type=int, default=120)
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--indexed-share", type=float, default=0.2, help="share of Jobs that are indexed (default 0.2)")
    parser.add_argument("--statefulsets", type=int, default=20)
    parser.add_argument("--daemonsets", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=50, help="nodes each DaemonSet runs a pod on (default 50)")
    parser.add_argument("--bare", type=int, default=400, help="bare pods (default 400)")
    parser.add_argument("--namespaces", type=int, default=12)
    parser.add_argument(
        "--horizon-s", type=float, default=3600.0, help="controllers start within this many seconds (default 3600)"
    )
    parser.add_argument("--sizes", default="64,256,1024,4096", help="cache sizes to try (default 64,256,1024,4096)")
    parser.add_argument("--rounds", type=int, default=3, help="CPU timing rounds, alternating (default 3)")
    args = parser.parse_args()
    creates = stream(args)
    config = settings.Settings()
    by_source = collections.Counter(c.source for c in creates)
    print(f"# {len(creates)} pod creates: " + ", ".join(f"{k} {v}" for k, v in by_source.most_common()), file=sys.stderr)
    summary: dict[str, Any] = {"creates": len(creates), "by_source": dict(by_source), "hit_rate": {}}
    sizes = [int(s) for s in args.sizes.split(",")]
    for size in sizes:
        hits: collections.Counter[str] = collections.Counter()
        outcomes: list[str] = []
        cache = decisioncache.Cache(max_entries=size, on_outcome=outcomes.append)
        for create in creates:
            _decide(cache, create, config)
            if outcomes[-1] == "hit":
                hits[create.source] += 1
        rate = cache.hits / len(creates)
        summary["hit_rate"][size] = round(rate, 4)
        print(
            f"cache {size:5d} entries: hit rate {rate:6.1%}  ("
            + ", ".join(f"{s} {hits[s] / n:.0%}" for s, n in by_source.most_common())
            + ")"
        )
    # CPU: the same stream through the engine alone and through the default-size cache, alternating.
    timings: dict[str, list[float]] = {"off": [], "on": []}
    for round_ in range(args.rounds):
        for mode in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
            maybe_cache = decisioncache.Cache() if mode == "on" else None
            started = time.process_time()
            for create in creates:
                _decide(maybe_cache, create, config)
            timings[mode].append((time.process_time() - started) / len(creates) * 1e6)
    off, on = sorted(timings["off"])[len(timings["off"]) // 2], sorted(timings["on"])[len(timings["on"]) // 2]
    # The key alone, over every create: what a miss adds to an evaluation.
    cache = decisioncache.Cache()
    cache._adopt(config)  # noqa: SLF001 - timing the key without deciding
    questions = [decisions.Question(object=create.pod, namespace=create.namespace) for create in creates]
    started = time.process_time()
    for question in questions:
        cache._key(question, obj=question.object or {}, env_sources=())  # noqa: SLF001
    key_us = (time.process_time() - started) / len(creates) * 1e6
    print(
        f"engine CPU per review over the stream (median of {args.rounds}): cache off {off:.1f} µs, "
        f"cache on ({decisioncache.DEFAULT_MAX_ENTRIES} entries) {on:.1f} µs ({on / off:.2f}x); the key costs {key_us:.1f} µs a review"
    )
    summary.update(cpu_us_off=round(off, 1), cpu_us_on=round(on, 1), cpu_ratio=round(on / off, 3), key_us=round(key_us, 1))
    print(json.dumps(summary))
    records.write(
        bench="replica_stream",
        inputs=vars(args),
        figures={**summary, "engine_us_per_review": round(on, 1)},
        reference={"name": "the same stream without the decision cache", "figures": {"engine_us_per_review": round(off, 1)}},
        headline=records.Headline(
            figure="engine_us_per_review", label="engine CPU per review over a modelled create stream", unit="µs", better="lower"
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
