"""Verdicts remembered by everything they depend on, so the replicas of one pod template are judged once.

A Deployment's pods, a Job's completions and a DaemonSet's pods are copies of one template; the
audit judges each through the whole engine. Within one run everything else a policy's result
depends on is fixed (the settings, the clock, each namespace's labels, the looked-up ConfigMaps
and Secrets, which `webhook.kube.envsources.env_lookup` reads once a run), so two pods that differ
only in what no policy reads get the same results, bar the object they name. `Memo` keeps those
results by a digest of the pod less those fields and gives them back re-aimed at the next pod.
What is remembered (`scan.run`): every policy's result, the template checks' and the pod checks'
of `scan.SHARED_POD_CHECK_IDS` (their context, the pod's node by `spec.nodeName` and every node,
is fixed for a run); the pod checks that read the uid run on each pod.

**What is left out of the key** (`normalized`, on top of `policies.replicas.replica_form`, which
the webhook's decision cache shares): the metadata a controller sets differently on each replica
and that no built-in policy or template check reads (`replicas.VOLATILE_METADATA`: name,
generateName, uid, creationTimestamp, resourceVersion, managedFields; name and generateName stay
in where a settings exception matches by name), every status field but `phase` (the one the GPU
model reads, `allocation.is_terminal`), and the random five characters of the ServiceAccount
token volume (`kube-api-access-xxxxx`, where a pod has exactly one such projected volume: the
volume and its mounts are renamed one placeholder no real volume can have). Everything else,
`spec.nodeName` and the annotations included, is in the key. The object is dumped in its own key
order: equal dumps mean equal objects; the same object with its keys in another order is a miss,
never a wrong answer.

**The policies' results alone** are also remembered under a second key (`policies_form`): the
pod less `spec.nodeName` and the allocation annotations, which no validator the audit runs reads
(see `policies_form`). Replicas of a GPU template differ in just those (each is bound to its own
node and card), so on a miss of the whole key the engine usually need not run: at 100,000 bench
pods, 30,900 distinct whole keys but 2,000 policies keys. The template checks' results (GPU207,
which reads the template's resources and mode selectors) are remembered with them; the pod checks
still run on each such miss. A failure's message opens with its policy's ID, which is not searched
for volatile values (a card index "0" is in "GPU207").

**Never remembered**: with user (CEL) policies in the settings (CEL may read any field, the name
and uid included); a result whose subject is not the object itself; a set of results whose
message or related objects contain the pod's name, generateName, uid or token volume name: it is
right for that pod only. Bounded: `MAX_ENTRIES` digests, oldest out first.

`tests/unit/audit/test_audit_memo.py` holds every finding and every rendering of a run with the
memo equal, byte for byte, to those of a run without it, on generated replicas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from policies import gpu, replicas
from policies import settings as settings_
from webhook.audit import findings

MAX_ENTRIES = 16_384


def normalized(obj: Mapping[str, Any], *, keeps_names: bool) -> tuple[dict[str, Any], list[str]]:
    """``obj`` without what its replicas differ in (see the module docstring), and the values taken out.

    ``replicas.replica_form`` plus the audit's own part: every status field but ``phase`` goes too
    (``status`` moved last), and the pod's name, generateName and uid count as taken out even where
    they stay in the key, so that a result naming the pod is never shared."""
    form = replicas.replica_form(obj, keeps_names=keeps_names)
    out = {key: value for key, value in form.object.items() if key != "status"}
    status = obj.get("status")
    if isinstance(status, Mapping):
        out["status"] = {"phase": status["phase"]} if "phase" in status else {}
    elif "status" in obj:
        out["status"] = status
    metadata = obj.get("metadata")
    volatile: list[str] = []
    if isinstance(metadata, Mapping):
        volatile = [v for f in replicas.IDENTITY_FIELDS if isinstance(v := metadata.get(f), str) and v]
    if form.token_volume is not None:
        volatile.append(form.token_volume)
    return out, volatile


def dumped_in_place(obj: Mapping[str, Any], *, keeps_names: bool) -> tuple[bytes, list[str]] | None:
    """``orjson.dumps`` of ``normalized(obj)[0]`` and ``normalized(obj)[1]``, byte for byte, without
    copying the pod: its token volume and the mounts of it are renamed in place for the dump and
    named back after it (so ``obj`` is left as it was, key order included); only the top level,
    metadata and status are new, small dicts. ``(b"", volatile)`` where orjson cannot write the
    object; None where ``obj`` or a part to rename is not plain decoded JSON (a dict, a list):
    then ``normalized`` is the way.

    The key is as discriminating as ``normalized``'s because it is the same bytes
    (``tests/unit/audit/test_audit_memo.py`` holds them equal over generated pods and odd shapes)."""
    if type(obj) is not dict:
        return None
    metadata = obj.get("metadata")
    volatile: list[str] = []
    slim_metadata: Any = metadata
    if isinstance(metadata, Mapping):
        if type(metadata) is not dict:
            return None
        volatile = [v for f in replicas.IDENTITY_FIELDS if isinstance(v := metadata.get(f), str) and v]
        left_out = _LEFT_OUT_KEEPING_NAMES if keeps_names else replicas.VOLATILE_METADATA
        slim_metadata = {k: v for k, v in metadata.items() if k not in left_out}
    renamed = _token_parts(obj)
    if renamed is None:
        return None
    token, parts = renamed
    if token is not None:
        volatile.append(token)
    out = {key: (slim_metadata if key == "metadata" else value) for key, value in obj.items() if key != "status"}
    if "status" in obj:
        status = obj["status"]
        if isinstance(status, Mapping):
            status = {"phase": status["phase"]} if "phase" in status else {}
        out["status"] = status
    for part in parts:
        part["name"] = replicas.TOKEN_VOLUME
    try:
        dumped = orjson.dumps(out)
    except (TypeError, orjson.JSONEncodeError):  # a lone surrogate, an integer past 64 bits
        dumped = b""
    finally:
        if token is not None:
            for part in parts:
                part["name"] = token
    return dumped, volatile


_LEFT_OUT_KEEPING_NAMES = replicas.VOLATILE_METADATA - replicas.NAMES


def _token_parts(obj: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]]] | None:
    """The pod's one token volume name (``replicas.token_volume_name``) and the volumes and mounts
    that ``replicas.token_volume_renamed`` renames; None where one of them is not a dict."""
    token = replicas.token_volume_name(obj)
    if token is None:
        return None, []
    spec, volumes = obj["spec"], obj["spec"]["volumes"]
    if type(spec) is not dict or type(volumes) is not list:
        return None
    parts: list[dict[str, Any]] = []
    for volume in volumes:
        if isinstance(volume, Mapping) and volume.get("name") == token:
            if type(volume) is not dict:
                return None
            parts.append(volume)
    for field in ("containers", "initContainers", "ephemeralContainers"):
        containers = spec.get(field)
        if not isinstance(containers, list):
            continue
        if type(containers) is not list:
            return None
        for container in containers:
            mounts = container.get("volumeMounts") if isinstance(container, Mapping) else None
            if not isinstance(mounts, list):
                continue
            if type(container) is not dict or type(mounts) is not list:
                return None
            for mount in mounts:
                if isinstance(mount, Mapping) and mount.get("name") == token:
                    if type(mount) is not dict:
                        return None
                    parts.append(mount)
    return token, parts


def retarget(found: findings.Finding, subject: findings.ObjectRef) -> findings.Finding:
    """``dataclasses.replace(found, subject=subject)``, without re-running the dataclass' init."""
    return findings.retargeted(found, subject)


# What the extender's bind adds to a pod and no validator the audit runs reads (`policies_form`).
BOUND_ANNOTATIONS = frozenset(gpu.ALLOCATION_ANNOTATIONS)


def policies_form(obj: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]] | None:
    """``obj`` less ``spec.nodeName`` and the allocation annotations (``gpu.ALLOCATION_ANNOTATIONS``),
    and the values taken out; None where ``obj``, its metadata or spec is not a plain dict.

    The key of the policies' results alone (`Memo.policies_key`): a bound pod's node and card
    allocation are what makes most replicas of a GPU template differ (each holds its own card), and
    none of the validators the audit runs reads them. GPU008, which judges them, is left out of the
    audit (`Policy.stored_objects`); GPU009 reads nodeName on the ephemeralcontainers subresource
    only, never on the CREATE the audit judges; GPU010 reads device-request annotation keys, no
    allocation key among them; settings exceptions match by namespace, name and labels.
    `tests/unit/audit/test_audit_memo_key.py` holds every policy's result equal for generated pods
    and the same pods with these fields changed or gone, under several settings."""
    if type(obj) is not dict:
        return None
    metadata, spec = obj.get("metadata"), obj.get("spec")
    if type(metadata) is not dict or type(spec) is not dict:
        return None
    dropped: list[str] = []
    annotations = metadata.get("annotations")
    if type(annotations) is dict and not BOUND_ANNOTATIONS.isdisjoint(annotations):
        dropped.extend(v for k, v in annotations.items() if k in BOUND_ANNOTATIONS and isinstance(v, str) and v)
        metadata = {**metadata, "annotations": {k: v for k, v in annotations.items() if k not in BOUND_ANNOTATIONS}}
    if "nodeName" in spec:
        node = spec["nodeName"]
        if isinstance(node, str) and node:
            dropped.append(node)
        spec = {k: v for k, v in spec.items() if k != "nodeName"}
    return {**obj, "metadata": metadata, "spec": spec}, dropped


class Memo:
    """The remembered results of one audit run under one ``Settings`` (see the module docstring)."""

    def __init__(self, settings: settings_.Settings, *, max_entries: int = MAX_ENTRIES) -> None:
        self.enabled = not settings.user_policies and max_entries > 0
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0
        self._keeps_names = any(e.names for e in settings.exceptions)
        self._entries: dict[bytes, tuple[findings.Finding, ...]] = {}
        self._policy_entries: dict[bytes, tuple[findings.Finding, ...]] = {}
        self.policy_hits = 0

    def key(self, obj: Mapping[str, Any]) -> tuple[bytes, list[str]] | None:
        """The digest of ``obj`` less its volatile fields, and those fields' values; None: not to be remembered."""
        if not self.enabled:
            return None
        keyed = dumped_in_place(obj, keeps_names=self._keeps_names)
        if keyed is None:  # not plain decoded JSON: the reference path
            slim, volatile = normalized(obj, keeps_names=self._keeps_names)
            try:
                keyed = orjson.dumps(slim), volatile
            except (TypeError, orjson.JSONEncodeError):  # a lone surrogate, an integer past 64 bits
                return None
        elif not keyed[0]:
            return None
        return replicas.digest(keyed[0]), keyed[1]

    def policies_key(self, obj: Mapping[str, Any]) -> tuple[bytes, list[str]] | None:
        """`key` of `policies_form(obj)`, for the policies' results alone; its volatile values include
        the node and annotation values taken out (a message quoting one is right for this pod only)."""
        if not self.enabled:
            return None
        form = policies_form(obj)
        if form is None:
            return None
        keyed = self.key(form[0])
        return None if keyed is None else (keyed[0], [*keyed[1], *form[1]])

    def get_policies(self, digest: bytes, subject: findings.ObjectRef) -> list[findings.Finding] | None:
        """The policies' results remembered under ``digest`` (`policies_key`), about ``subject``."""
        found = self._policy_entries.get(digest)
        if found is None:
            return None
        self.policy_hits += 1
        return [retarget(f, subject) for f in found]

    def put_policies(
        self, digest: bytes, volatile: Sequence[str], subject: findings.ObjectRef, results: Sequence[findings.Finding]
    ) -> None:
        """`put` for the policies' results under their own key."""
        self._remember(self._policy_entries, digest, volatile, subject, results)

    def get(self, digest: bytes, subject: findings.ObjectRef) -> list[findings.Finding] | None:
        """The results remembered under ``digest``, about ``subject``; None when there are none."""
        found = self._entries.get(digest)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        return [retarget(f, subject) for f in found]

    def put(
        self, digest: bytes, volatile: Sequence[str], subject: findings.ObjectRef, results: Sequence[findings.Finding]
    ) -> None:
        """Remember ``results`` (all about ``subject``) unless one of them is about something else or names a volatile value."""
        self._remember(self._entries, digest, volatile, subject, results)

    def _remember(
        self,
        entries: dict[bytes, tuple[findings.Finding, ...]],
        digest: bytes,
        volatile: Sequence[str],
        subject: findings.ObjectRef,
        results: Sequence[findings.Finding],
    ) -> None:
        for found in results:
            if found.subject != subject:
                return
            if (
                volatile
                and found.related
                and any(value in ref.name or value == ref.uid for ref in found.related for value in volatile)
            ):
                return
        if volatile:
            # Every message at once: joined, a value found across two messages only keeps a set out
            # that could have been kept; one found in a message is always found in the join. A
            # failure's message opens with its policy's ID (`"GPU207: ..."`), which is the finding's
            # own `policy` and no value of the pod's: it is not searched, or a card index or GiB
            # value such as "0" or "2" would keep every failing set out.
            messages = "\n".join(_past_id(found) for found in results)
            if any(value in messages for value in volatile):
                return
        if len(entries) >= self.max_entries:
            del entries[next(iter(entries))]
        entries[digest] = tuple(results)


def _past_id(found: findings.Finding) -> str:
    """``found.message`` less its opening ``"<policy ID>: "`` (the finding's own ``policy``), if it has one."""
    message, opening = found.message, found.policy + ": "
    return message[len(opening) :] if message.startswith(opening) else message
