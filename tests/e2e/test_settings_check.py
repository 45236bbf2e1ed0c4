"""The settings ConfigMap is checked where it is written (issue 36): through the real apiserver, a
write of gpu-admission-policy that would not load is refused with the load's own line."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.e2e.harness import Cluster
from webhook.admission import settingscheck

pytestmark = pytest.mark.e2e

HOME = "gpu-admission"


def _configmap(text: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": settingscheck.CONFIGMAP, "namespace": HOME},
            "data": {settingscheck.KEY: text},
        }
    )


def test_a_budget_selecting_no_namespace_is_refused_and_a_good_one_is_written(cluster: Cluster) -> None:
    team = cluster.namespace()
    label = f"team-{uuid.uuid4().hex[:6]}"
    assert cluster.kubectl("label", "namespace", team, f"gpu-admission.io/e2e-team={label}").returncode == 0
    assert cluster.kubectl("create", "namespace", HOME).returncode in (0, 1)  # the ledger namespace; may exist
    try:
        typo = "gpuBudgets:\n  - {name: a, namespaceSelector: {matchLabels: {gpu-admission.io/e2e-team: nobody}}, memory: 32Gi}\n"
        refused = cluster.kubectl("apply", "-f", "-", stdin=_configmap(typo))
        assert refused.returncode != 0
        assert "budget 'a' selects no namespace that exists; check its namespaceSelector" in refused.stderr

        negative = "gpuBudgets: [{name: a, namespaces: [x], memory: -1Gi}]\n"
        refused = cluster.kubectl("apply", "-f", "-", stdin=_configmap(negative))
        assert refused.returncode != 0
        assert "gpuBudgets[0].memory: must not be negative, got '-1Gi'" in refused.stderr

        good = f"gpuBudgets:\n  - {{name: a, namespaceSelector: {{matchLabels: {{gpu-admission.io/e2e-team: {label}}}}}, memory: 32Gi}}\n"
        written = cluster.kubectl("apply", "-f", "-", stdin=_configmap(good))
        assert written.returncode == 0, written.stderr
        stored = cluster.get("configmap", settingscheck.CONFIGMAP, namespace=HOME)
        assert stored["data"][settingscheck.KEY] == good

        later = cluster.kubectl("apply", "-f", "-", stdin=_configmap(good.replace("32Gi", "lots")))
        assert later.returncode != 0 and "'lots' is not a quantity" in later.stderr  # an UPDATE is judged too
    finally:
        cluster.kubectl("delete", "configmap", settingscheck.CONFIGMAP, "-n", HOME, "--ignore-not-found")
