"""A deleted pod frees its card at once (issue 38): on a spread node of 4 x 15 GiB, four 3 GiB pods
created one at a time right after an earlier set on that node was deleted land on four different
cards, with the earlier pods still Terminating (KWOK, like a kubelet, finishes a deleted pod some
time within its grace period). Before, the extender counted them until their objects were gone and
stacked the new pods on the lowest cards ([0, 1, 2, 0])."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.harness import Cluster, eventually
from tests.e2e.test_explain import pod
from tests.e2e.test_extender import Pool, allocation, card_use, create, make_pool

pytestmark = pytest.mark.e2e

CARD_MIB = 15360


@pytest.fixture(scope="module")
def pools(cluster: Cluster) -> Iterator[list[str]]:
    created: list[str] = []
    yield created
    if created:
        cluster.kubectl("delete", "node", "--wait=false", *created)


def _one_at_a_time(cluster: Cluster, namespace: str, names: list[str], *, pool: Pool) -> list[int]:
    """Each pod created once the one before is bound; the card each got."""
    found: list[int] = []
    for name in names:
        create(cluster, [pod(name, pool=pool, mem=3)], namespace=namespace)

        def bound(name: str = name) -> bool:
            return bool(cluster.get("pod", name, namespace=namespace)["spec"].get("nodeName"))

        eventually(bound, what=f"{name} bound", timeout=120)
        found.append(allocation(cluster.get("pod", name, namespace=namespace))["cards"][0])
    return found


def test_pods_created_right_after_a_set_was_deleted_land_on_four_cards(cluster: Cluster, pools: list[str]) -> None:
    pool = make_pool(cluster, pools, placement="spread", gpus=(CARD_MIB,) * 4)
    namespace = cluster.namespace()
    assert _one_at_a_time(cluster, namespace, [f"old-{i}" for i in range(4)], pool=pool) == [0, 1, 2, 3]
    deleted = cluster.kubectl("delete", "pod", "-n", namespace, "--wait=false", *(f"old-{i}" for i in range(4)))
    assert deleted.returncode == 0, deleted.stderr
    assert _one_at_a_time(cluster, namespace, [f"new-{i}" for i in range(4)], pool=pool) == [0, 1, 2, 3]
    card_use(cluster, pool, namespace)  # and no card is over-committed by what the apiserver stores
