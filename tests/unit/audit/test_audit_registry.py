"""The audit checks' registry: one module per check, every module registered once, IDs unique and stable,
and the scan runs every registered check of each kind."""

from __future__ import annotations

import datetime
import inspect
import pkgutil
import re
from collections.abc import Mapping
from typing import Any

import pytest

from policies import model, settings
from tests.unit.audit.conftest import PodFactory
from webhook.audit import checks, findings, scan
from webhook.audit.checks import base, gpu209_expired_exception

# The modules of the package that hold no check.
SUPPORT_MODULES = frozenset({"base", "facts"})
KIND_BASES: tuple[type[base.Check], ...] = (
    base.TemplateCheck,
    base.PodCheck,
    base.NodeCheck,
    base.EnvSourceCheck,
    base.ExceptionCheck,
    base.NamespaceCheck,
    base.ChargeCheck,
)
# The IDs and rule names reports carry: a check is never renumbered or renamed.
STABLE: dict[str, str] = {
    "GPU201": "gpu-access-without-request",
    "GPU202": "card-overcommitted",
    "GPU203": "orphaned-reservation",
    "GPU204": "missing-card",
    "GPU205": "mode-resource-mismatch",
    "GPU206": "card-model-labels",
    "GPU207": "mode-selector",
    "GPU208": "mode-resource-missing",
    "GPU209": "expired-exception",
    "GPU210": "unaccounted-gpu-pod",
    "GPU211": "guarded-env-source",
    "GPU212": "stale-allocation",
    "GPU213": "out-of-band-gpu-process",
    "GPU214": "pod-exceeds-request",
    "GPU215": "card-use-exceeds-allocations",
    "GPU216": "dra-double-booking",
    "GPU217": "unrecognised-gpu-node",
    "GPU218": "namespace-over-budget",
    "GPU219": "unknown-budget-charge",
}


def package_modules() -> set[str]:
    return {info.name for info in pkgutil.iter_modules(checks.__path__)}


def test_every_module_of_the_package_is_a_registered_check_or_a_support_module() -> None:
    check_modules = package_modules() - SUPPORT_MODULES
    registered = {type(check).__module__.rsplit(".", 1)[-1] for check in checks.CHECKS}

    assert check_modules == registered, "register each check module's class in checks.CHECKS, once"
    assert all(re.fullmatch(r"gpu\d{3}_[a-z0-9_]+", name) for name in check_modules), sorted(check_modules)
    assert SUPPORT_MODULES <= package_modules()


def test_each_check_module_holds_one_check_whose_id_is_its_file_number() -> None:
    for check in checks.CHECKS:
        module = inspect.getmodule(type(check))
        assert module is not None
        defined = [
            cls
            for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, base.Check) and cls.__module__ == module.__name__ and not inspect.isabstract(cls)
        ]
        assert defined == [type(check)], module.__name__
        assert module.__name__.rsplit(".", 1)[-1].startswith(check.id.lower() + "_")


def test_ids_are_unique_in_order_and_the_same_set_with_the_same_rule_names() -> None:
    ids = [check.id for check in checks.CHECKS]

    assert ids == sorted(set(ids))
    assert {check.id: check.rule for check in checks.CHECKS} == STABLE


def test_every_check_is_of_a_kind_and_carries_what_a_report_needs() -> None:
    for check in checks.CHECKS:
        assert isinstance(check, KIND_BASES), f"{check.id} derives from no kind base"
        assert check.summary and not check.summary.endswith("."), check.id
        assert isinstance(check.severity, findings.Severity) and isinstance(check.action, model.Action)
        assert check.category.startswith("GPU "), check.id


def test_the_scan_runs_every_registered_check_of_each_kind() -> None:
    by_kind = {
        base.TemplateCheck: scan.TEMPLATE_CHECKS,
        base.PodCheck: scan.POD_CHECKS,
        base.NodeCheck: scan.NODE_CHECKS,
        base.EnvSourceCheck: scan.ENV_SOURCE_CHECKS,
        base.ExceptionCheck: scan.EXCEPTION_CHECKS,
        base.NamespaceCheck: scan.NAMESPACE_CHECKS,
        base.ChargeCheck: scan.CHARGE_CHECKS,
    }
    for kind, listed in by_kind.items():
        assert listed == tuple(c for c in checks.CHECKS if isinstance(c, kind)), kind.__name__
    assert {c.id for listed in by_kind.values() for c in listed} == set(STABLE)
    # GPU203 judges pods and nodes alike.
    assert {c.id for c in scan.POD_CHECKS} & {c.id for c in scan.NODE_CHECKS} == {"GPU203"}


# GPU209 is the one check no other test file judges directly.
GPU209 = gpu209_expired_exception.ExpiredException()
NOW = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)


def test_gpu209_an_expired_exception_fails_and_one_still_in_force_is_not_judged() -> None:
    old = settings.PolicyException(
        name="old", policies=frozenset({"GPU003", "GPU002"}), expires=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    )
    fresh = settings.PolicyException(name="fresh", policies=frozenset({"GPU002"}), expires=NOW + datetime.timedelta(days=1))
    endless = settings.PolicyException(name="endless", policies=frozenset({"GPU002"}))

    found = GPU209.check_exception(old, now=NOW)

    assert found is not None
    assert (found.result, found.action, found.subject.kind, found.subject.name) == (
        model.Result.FAIL,
        model.Action.WARN,
        "GpuAdmissionException",
        "old",
    )
    assert found.message == (
        "GPU209: exceptions in the settings are removed or renewed when they expire: "
        "exception 'old' for GPU002, GPU003 expired 2026-01-01T00:00:00+00:00"
    )
    assert GPU209.check_exception(fresh, now=NOW) is None
    assert GPU209.check_exception(endless, now=NOW) is None


class _Labelled(base.PodCheck):
    """A check that exists only in this test: pods must carry the label `team`."""

    id = "GPU299"
    rule = "team-label"
    summary = "pods carry a team label"
    severity = findings.Severity.LOW
    category = "GPU Test"
    action = model.Action.WARN

    def check_pod(self, pod: Mapping[str, Any], context: base.PodContext) -> findings.Finding | None:
        labels = pod.get("metadata", {}).get("labels", {})
        result = model.Result.PASS if "team" in labels else model.Result.FAIL
        return self.finding(findings.ObjectRef.of(pod), result=result, detail="" if "team" in labels else "no team label")


def test_a_check_on_the_scans_list_is_run_with_exemptions_applied_like_any_other(
    monkeypatch: pytest.MonkeyPatch, pod: PodFactory
) -> None:
    monkeypatch.setattr(scan, "POD_CHECKS", (*scan.POD_CHECKS, _Labelled()))
    plain, exempt = pod("plain"), pod("system", namespace="kube-system")

    audit = scan.run(scan.Inventory.of([plain, exempt]), settings=settings.Settings(), now=1_750_000_000.0)

    results = {(f.subject.namespace, f.result, f.message) for f in audit.findings if f.policy == "GPU299"}
    assert results == {
        ("team-a", model.Result.FAIL, "GPU299: pods carry a team label: no team label"),
        ("kube-system", model.Result.SKIP, "namespace kube-system is exempt"),
    }
