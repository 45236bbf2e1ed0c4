"""Decisions remembered by everything they depend on, so replicas of one pod template are judged once.

A Deployment's ReplicaSet, a Job's completions and a DaemonSet create many pods from one template;
the webhook is asked about each, and each asks the engine the same question. ``Cache.decide``
answers a repeated question from memory and any other one with ``decisions.decide``, and gives the
same ``model.Decision`` either way: the handlers build the response, log, count and record Events
from it exactly as before, per request (uid, name, review mark).

**The key** is a 128-bit BLAKE2b digest of a JSON document holding every input of the verdict
(and one byte more for the last):

- the object, less the metadata that differs between replicas and that no built-in policy reads
  (``replicas.VOLATILE_METADATA``: name, generateName, uid, creationTimestamp, resourceVersion,
  managedFields), and with the ServiceAccount token volume's random name (``kube-api-access-``
  and five characters, added to every pod before the webhooks run) made one placeholder
  (``policies.replicas.replica_form``, shared with the audit's verdict memo). Where an
  exception of the settings matches by name, name and generateName stay in. Unlike the audit's
  key, the whole ``status`` stays in (a CREATE's is whatever the client sent). The object is
  dumped in its own key order: equal dumps mean equal objects, and the same object with its keys
  in another order is only a miss, never a wrong answer;
- the operation, the namespace the engine judges in, and that namespace's labels (or that they
  are unknown);
- whether the pod is judged as stored (``Question.stored``, mutators off: the validating
  webhook's second question, ``decisions.needs_stored``), as one byte after the digest, so the
  validating webhook's two questions cost one digest;
- the username, groups and dryRun (no built-in reads them today; a replica's creator is the same
  controller, so keeping them costs no hits);
- GPU001's looked-up sources: each referenced ConfigMap/Secret with the data the lookup found
  (or that none was found), and whether there was a lookup at all.

**The settings** are not in the key: the cache belongs to one ``Settings`` object and empties
itself when the live settings are another (a reload builds a new one).

**Time**: an exception with ``expires`` stops applying at that instant, so an entry is kept only
until the earliest expiry still ahead when it was computed.

**Never cached** (``bypass`` counts them): anything but a CREATE without a subresource (an
UPDATE's verdict depends on the old object, an ephemeralcontainers update on the Node's labels);
kinds without a pod template (GPU007 judges ConfigMaps and Secrets by name); settings with user
policies (CEL may read any field of the request, the name and uid included); a review whose Node
labels were looked up; a review whose key cannot be built (looked-up data that is not text).
Pods unique by design miss every time: a StatefulSet's (pod-name label, hostname), an indexed
Job's (completion index), a DaemonSet's (pinned to its node by affinity).

**Patches** are add operations at paths inside the spec, the template or ``metadata.annotations``
and ``metadata.labels``: they never name the pod, so the cached patch fits every pod with the same
key. A decision whose messages or patch contain one of the values left out of the key (the pod's
name, generateName, uid, the token volume's name) is right for that pod only and is not kept.
``tests/unit/webhook/test_decision_cache.py`` holds every generated pod's answer with the cache on
equal to the answer with it off, names varied, across a reload and a namespace-label change.

Bounded: at most ``max_entries`` (least recently used out first).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from policies import model, podspec, replicas, settings
from webhook.admission import decisions, jsoncodec

DEFAULT_MAX_ENTRIES = 1024

Outcome = Literal["hit", "miss", "bypass"]


@dataclasses.dataclass(frozen=True)
class _Entry:
    decision: model.Decision
    valid_until: datetime.datetime | None


@dataclasses.dataclass
class Cache:
    """The decisions of recent reviews under one ``Settings``; see the module docstring."""

    max_entries: int = DEFAULT_MAX_ENTRIES
    # Told each review's outcome (the handlers count it as a metric).
    on_outcome: Callable[[Outcome], None] = lambda outcome: None
    hits: int = 0
    misses: int = 0
    bypassed: int = 0
    _settings: settings.Settings | None = None
    _keeps_names: bool = False
    _expiries: tuple[datetime.datetime, ...] = ()
    _entries: collections.OrderedDict[bytes, _Entry] = dataclasses.field(default_factory=collections.OrderedDict)

    def __len__(self) -> int:
        return len(self._entries)

    def decide(
        self,
        question: decisions.Question,
        *,
        settings: settings.Settings,
        env_sources: Iterable[model.EnvSource] = (),
        validating: bool = False,
    ) -> model.Decision:
        """``decisions.judge(question, settings=settings, validating=validating)``, each of its
        (at most two) answers from the cache where its key was seen (``env_sources``: the sources
        ``question.env_lookup`` was asked to fetch). The question as stored differs from the
        first in ``stored`` alone, so both keys come from one digest."""
        if question.now is None:
            question = dataclasses.replace(question, now=datetime.datetime.now(datetime.UTC))
        obj = question.object
        if (
            self.max_entries <= 0
            or obj is None
            or question.operation != "CREATE"
            or question.subresource
            or question.node_labels is not None
            or question.claims is not None  # looked-up claims change without the pod changing
            or settings.user_policies
            or obj.get("kind") not in podspec.SUPPORTED_KINDS
        ):
            return decisions.judge(question, settings=settings, validating=validating, ask=self._bypass)
        if settings is not self._settings:
            self._adopt(settings)
        try:
            digest, volatile = self._key(question, obj=obj, env_sources=env_sources)
        except (TypeError, ValueError):  # an input JSON cannot hold (looked-up data not text): not cached
            return decisions.judge(question, settings=settings, validating=validating, ask=self._bypass)

        def recall(asked: decisions.Question, current: _Settings) -> model.Decision:
            return self._recall(digest + _STORED[asked.stored], asked, settings=current, volatile=volatile)

        return decisions.judge(question, settings=settings, validating=validating, ask=recall)

    def _bypass(self, question: decisions.Question, current: settings.Settings) -> model.Decision:
        self.bypassed += 1
        self.on_outcome("bypass")
        return decisions.answer(question, settings=current)

    def _recall(
        self, key: bytes, question: decisions.Question, *, settings: settings.Settings, volatile: list[str]
    ) -> model.Decision:
        """The decision kept under ``key`` while still valid, else the engine's (kept unless it
        names one of the ``volatile`` values)."""
        now = question.now
        assert now is not None  # set by decide
        entry = self._entries.get(key)
        if entry is not None and (entry.valid_until is None or now < entry.valid_until):
            self._entries.move_to_end(key)
            self.hits += 1
            self.on_outcome("hit")
            return entry.decision
        decision = decisions.answer(question, settings=settings)
        self.misses += 1
        self.on_outcome("miss")
        if volatile and _mentions(decision, volatile):
            return decision  # it names this pod: right for this pod only
        self._entries[key] = _Entry(decision=decision, valid_until=min((e for e in self._expiries if e > now), default=None))
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return decision

    def _adopt(self, current: settings.Settings) -> None:
        """Start over for new settings: nothing judged under the old ones is kept."""
        self._entries.clear()
        self._settings = current
        self._keeps_names = any(e.names for e in current.exceptions)
        self._expiries = tuple(sorted(e.expires for e in current.exceptions if e.expires is not None))

    def _key(
        self, question: decisions.Question, *, obj: Mapping[str, Any], env_sources: Iterable[model.EnvSource]
    ) -> tuple[bytes, list[str]]:
        """The digest of every input but ``stored``, and the values left out of it (a decision
        naming one of them is not kept)."""
        form = replicas.replica_form(obj, keeps_names=self._keeps_names)  # the status stays in: see the module docstring
        sources: list[Any] | None = None
        env_lookup = question.env_lookup
        if env_lookup is not None:
            sources = []
            for source in sorted(set(env_sources), key=lambda s: (s.kind, s.namespace, s.name)):
                data = env_lookup(source)
                sources.append([source.kind, source.namespace, source.name, None if data is None else sorted(data.items())])
        labels = question.namespace_labels
        document = [
            question.operation,
            question.judged_namespace,
            None if labels is None else sorted(labels.items()),
            question.user,
            list(question.groups),
            question.dry_run,
            sources,
            form.object,
        ]  # and whether the pod is judged as stored: one byte after the digest (`_STORED`)
        return replicas.digest(jsoncodec.dumps(document)), form.volatile


_Settings = settings.Settings  # `settings` is also the parameter's name in `decide`
_STORED = {False: b"\x00", True: b"\x01"}  # the key's last byte: judged as sent, or as stored


def _mentions(decision: model.Decision, values: list[str]) -> bool:
    """Whether any message or the patch of ``decision`` contains one of ``values``."""
    texts = (
        [v.message for v in decision.violations]
        + [r.message for r in decision.results]
        + list(decision.warnings)
        + list(decision.notices)
    )
    texts += [decision.exempt_reason, json.dumps(list(decision.patch), ensure_ascii=False)]
    joined = "\n".join(texts)
    return any(value in joined for value in values)
