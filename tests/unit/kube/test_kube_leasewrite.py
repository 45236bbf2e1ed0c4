"""`leasewrite.write`: a Lease created where none was read, else replaced at the version read."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

from webhook.kube import errors, leasewrite


class Leases:
    """Records the calls; `refuse` is raised by the next one."""

    def __init__(self, refuse: Exception | None = None) -> None:
        self.calls: list[tuple[str, str, str, dict[str, Any]]] = []
        self.refuse = refuse

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", namespace, "", copy.deepcopy(dict(body))))
        if self.refuse is not None:
            raise self.refuse
        return {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("replace", namespace, name, copy.deepcopy(dict(body))))
        if self.refuse is not None:
            raise self.refuse
        return {**body, "metadata": {**body["metadata"], "resourceVersion": "9"}}


BODY: dict[str, Any] = {
    "apiVersion": "coordination.k8s.io/v1",
    "kind": "Lease",
    "metadata": {"name": "gpu-ledger.n0", "namespace": "ledger"},
    "spec": {},
}


async def test_none_read_is_a_create_and_a_read_lease_is_replaced_at_its_version() -> None:
    leases = Leases()
    created = await leasewrite.write(leases, "ledger", BODY, read=None)
    assert created["metadata"]["resourceVersion"] == "1"
    replaced = await leasewrite.write(
        leases, "ledger", BODY, read={"metadata": {"name": "gpu-ledger.n0", "resourceVersion": "7"}}
    )
    assert replaced["metadata"]["resourceVersion"] == "9"
    assert leases.calls == [
        ("create", "ledger", "", BODY),
        ("replace", "ledger", "gpu-ledger.n0", {**BODY, "metadata": {**BODY["metadata"], "resourceVersion": "7"}}),
    ]
    assert "resourceVersion" not in BODY["metadata"], "the caller's body is left as it was"


@pytest.mark.parametrize("refusal", [errors.Conflict("moved on", status=409), errors.NotFound("gone", status=404)])
async def test_a_refused_write_reaches_the_caller_as_the_kube_error(refusal: Exception) -> None:
    with pytest.raises(type(refusal)):
        await leasewrite.write(Leases(refuse=refusal), "ledger", BODY, read={"metadata": {"resourceVersion": "7"}})
    with pytest.raises(type(refusal)):
        await leasewrite.write(Leases(refuse=refusal), "ledger", BODY, read=None)
