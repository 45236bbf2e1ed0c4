"""GPU201 on privilege short of `privileged: true`: SYS_ADMIN/ALL containers, and debug containers added to running pods."""

from __future__ import annotations

from typing import Any

import pytest

from policies import model
from tests.unit.audit.conftest import NodeFactory, PodFactory, judge_pod
from webhook.audit.checks import gpu201_gpu_access

GPU201 = gpu201_gpu_access.GpuAccessWithoutRequest()

VOID = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]


@pytest.mark.parametrize("added", [["SYS_ADMIN"], ["cap_sys_admin"], ["ALL"]])
def test_gpu201_a_sys_admin_or_all_container_on_a_gpu_node_fails(node: NodeFactory, pod: PodFactory, added: list[str]) -> None:
    found_pod = pod("agent", node_name="cgpu-0", env=VOID)
    found_pod["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": added}}

    found = judge_pod(GPU201, found_pod, node=node())

    assert found is not None and found.result is model.Result.FAIL
    assert f'container "main" adds capability {added[0]}' in found.message


def test_gpu201_a_privileged_debug_container_added_to_a_running_pod_fails(node: NodeFactory, pod: PodFactory) -> None:
    found_pod = pod("web", node_name="cgpu-0", env=VOID)
    debugger: dict[str, Any] = {"name": "debugger", "image": "busybox:1", "env": VOID, "securityContext": {"privileged": True}}
    found_pod["spec"]["ephemeralContainers"] = [debugger]

    found = judge_pod(GPU201, found_pod, node=node())

    assert found is not None and found.result is model.Result.FAIL
    assert 'ephemeral container "debugger" is privileged' in found.message


def test_gpu201_ordinary_capabilities_pass(node: NodeFactory, pod: PodFactory) -> None:
    found_pod = pod("web", node_name="cgpu-0", env=VOID)
    found_pod["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": ["NET_BIND_SERVICE", "IPC_LOCK"]}}

    found = judge_pod(GPU201, found_pod, node=node())

    assert found is None or found.result is model.Result.PASS
