"""`Settings.actions_in`: the per-namespace table the engine reads each policy's action from.

It must give exactly `Settings.action`'s answers for every namespace and label set, follow a new
settings version, keep a bounded number of tables, and leave the engine's decisions as they were.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from policies import builtin, engine, model, settings

OVERRIDES: dict[str, Any] = {
    "policies": {"GPU002": {"action": "warn"}, "GPU104": {"action": "audit"}},
    "namespaceOverrides": [
        {"name": "lab", "namespaces": ["lab"], "policies": {"GPU001": {"action": "off"}, "GPU002": {"action": "audit"}}},
        {
            "name": "tier",
            "namespaceSelector": {"matchLabels": {"tier": "dev"}},
            "policies": {"GPU001": {"action": "warn"}, "GPU003": {"action": "off"}},
        },
        {
            "name": "env",
            "namespaceSelector": {"matchExpressions": [{"key": "env", "operator": "In", "values": ["test"]}]},
            "policies": {"GPU004": {"action": "warn"}},
        },
    ],
}
NAMESPACES = ("lab", "team-a", "dev-1", "")
LABEL_SETS: tuple[dict[str, str] | None, ...] = (
    None,
    {},
    {"tier": "dev"},
    {"env": "test"},
    {"tier": "dev", "env": "test"},
    {"tier": "prod"},
    {settings.NAMESPACE_NAME_LABEL: "lab"},
)
IDS = [p.id for p in builtin.POLICIES] + ["GPU999", "not-a-policy"]


@pytest.mark.parametrize("document", [{}, OVERRIDES], ids=["defaults", "overrides"])
def test_the_table_gives_action_s_answer_for_every_namespace_and_label_set(document: dict[str, Any]) -> None:
    current = settings.from_mapping(document)
    for namespace, labels in itertools.product((None, *NAMESPACES), LABEL_SETS):
        table = current.actions_in(namespace, labels)
        for policy_id in IDS:
            expected = current.action(policy_id, namespace=namespace, namespace_labels=labels)
            assert table.get(policy_id, current.action(policy_id, namespace=namespace, namespace_labels=labels)) is expected
        # Every built-in is in the table: the engine never falls back for one.
        assert set(table) >= {p.id for p in builtin.POLICIES}


def test_the_overrides_really_differ_per_namespace_and_labels() -> None:
    current = settings.from_mapping(OVERRIDES)
    assert current.actions_in("lab", None)["GPU001"] is model.Action.OFF
    assert current.actions_in("team-a", None)["GPU001"] is model.Action.ENFORCE
    assert current.actions_in("team-a", {"tier": "dev"})["GPU001"] is model.Action.WARN
    # Same namespace, labels changed since: a different table, not the one kept for the old labels.
    assert current.actions_in("team-a", {"tier": "prod"})["GPU001"] is model.Action.ENFORCE
    assert current.actions_in("team-a", {"env": "test"})["GPU004"] is model.Action.WARN
    assert current.actions_in(None, {"tier": "dev"})["GPU001"] is model.Action.ENFORCE  # cluster-wide
    assert current.actions_in("team-a", None)["GPU002"] is model.Action.WARN  # configured, no override


def test_a_new_settings_version_starts_with_its_own_tables() -> None:
    before = settings.from_mapping(OVERRIDES)
    assert before.actions_in("lab", None)["GPU001"] is model.Action.OFF
    after = before.switched_off(["GPU005"])
    assert after.actions_in("lab", None)["GPU005"] is model.Action.OFF
    assert before.actions_in("lab", None)["GPU005"] is model.Action.ENFORCE
    assert after == settings.from_mapping(OVERRIDES).switched_off(["GPU005"])  # the tables are not part of equality


def test_the_tables_kept_are_bounded_and_unhashable_labels_are_answered_uncached() -> None:
    current = settings.from_mapping(OVERRIDES)
    for index in range(3 * settings._ACTION_TABLES):
        assert current.actions_in(f"ns-{index}", {"tier": "dev" if index % 2 else "prod"})["GPU001"] is (
            model.Action.WARN if index % 2 else model.Action.ENFORCE
        )
    assert len(current._action_tables) <= settings._ACTION_TABLES
    odd: Any = {"tier": ["dev"]}  # not what a Namespace carries, but never a crash or a stale answer
    assert current.actions_in("team-b", odd)["GPU001"] is current.action("GPU001", namespace="team-b", namespace_labels=odd)
    # Without namespace overrides one table serves every namespace.
    plain = settings.from_mapping({"policies": {"GPU001": {"action": "warn"}}})
    assert plain.actions_in("a", {"x": "y"}) is plain.actions_in("b", None)


def _pod(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                    "securityContext": {"privileged": True},
                    "resources": {"limits": {"aliyun.com/gpu-mem": "4"}},
                }
            ],
            "volumes": [{"name": "h", "hostPath": {"path": "/dev"}}],
        },
    }


@pytest.mark.parametrize(("namespace", "labels"), list(itertools.product(NAMESPACES[:3], LABEL_SETS)))
def test_the_engine_decides_as_it_would_with_action_per_policy(
    namespace: str, labels: dict[str, str] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    current = settings.from_mapping(OVERRIDES)
    request = model.Request(operation="CREATE", namespace=namespace, namespace_labels=labels, object=_pod(namespace))
    with_tables = engine.evaluate(request, settings=current)
    # The reference: no table at all, every action asked of `action` as before.
    monkeypatch.setattr(settings.Settings, "actions_in", lambda self, namespace=None, namespace_labels=None: {})
    without = engine.evaluate(request, settings=settings.from_mapping(OVERRIDES))
    assert with_tables == without
    assert with_tables.violations  # privileged with all cards and a hostPath: found somewhere, enforced or not
