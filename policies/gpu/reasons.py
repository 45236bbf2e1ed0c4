"""Why a GPU pod does not fit a node: stable reason codes with a sentence each.

The extender's filter (`placement.evaluate`) states each refusal as a `Reason`; the scheduler
extender joins their messages into `FailedNodes`, and `gpu-admission explain` / `simulate` show
code and message. The codes are a public contract (JSON output, README): never rename one.

| code | meaning |
|---|---|
| MODE_MISMATCH | the node's `ack.node.gpu.schedule` mode does not serve the pod's resource, or the pod's nodeSelector / required affinity excludes the node |
| CARD_MODEL | the pod's card-model constraint (GPU102's `gpu-model`, `exclude-gpu-model`, `min-gpu-memory`, judged per card) excludes every card of the node, or every card that meets it is too small or too few; for pods the device plugin places (`nvidia.com/gpu`), GPU102's node affinity on the card labels excludes the node |
| FRAGMENTED | the node's free memory in total is enough, but no single card has enough free |
| INSUFFICIENT_MEMORY | no card is large enough, or the node's free memory in total is short |
| CORE_EXHAUSTED | a card has the memory but not the free core percentage |
| NO_TOPOLOGY_SET | the node has no set of N free whole cards (`aliyun.com/gpu`) |
| RESERVED_IN_FLIGHT | the pod would fit but for reservations held by binds in flight (they expire) |
| STALE_ALLOCATION | cards are held by pods that no longer exist (or are past their deletion deadline) |
| UNSCHEDULABLE | the node is cordoned, or carries a NoSchedule/NoExecute taint the pod does not tolerate |
| NO_GPU | the node offers no GPU cards to place on (no inventory, no capacity, exclusive mode) |
| BAD_REQUEST | the pod's GPU request is malformed; it fits nowhere |
| NOT_CACHED | the extender has not loaded the node yet |
| DRA_ALLOCATED | a card that would hold the pod is allocated to a DRA ResourceClaim (matched by its UUID in the driver's ResourceSlice): it is offered again once the claim is released |
| NAMESPACE_BUDGET | the pod's namespace has a GPU budget (`gpuBudgets`) and the pod's charge on the node would take it over: names the budget, what is used and what the pod asks; retried when room frees up |
| PREEMPTION_IMPOSSIBLE | the node is full, and no set of pods of lower priority than the pod frees one card (or set of whole cards) for it: preemption cannot help here |
"""

from __future__ import annotations

import dataclasses
import enum

# A Terminating pod still holds its cards (kube-scheduler and the extender count it until the object
# is gone). Past its deletion deadline by this much its node is likely lost, and its allocation is
# called stale (explain's STALE_ALLOCATION, the audit's GPU212): force-deleting the pod frees it.
STUCK_TERMINATING_S = 300.0
# How long after a bind decision a ledger entry of a pod that no longer exists may still be seen:
# the extender stops counting it after reservations.IN_FLIGHT_GRACE_S and prunes it on its next tidy pass
# (every few seconds); one older than this means the release did not happen.
PRUNE_DEADLINE_S = 60.0


class Code(enum.StrEnum):
    MODE_MISMATCH = "MODE_MISMATCH"
    CARD_MODEL = "CARD_MODEL"
    FRAGMENTED = "FRAGMENTED"
    INSUFFICIENT_MEMORY = "INSUFFICIENT_MEMORY"
    CORE_EXHAUSTED = "CORE_EXHAUSTED"
    NO_TOPOLOGY_SET = "NO_TOPOLOGY_SET"
    RESERVED_IN_FLIGHT = "RESERVED_IN_FLIGHT"
    STALE_ALLOCATION = "STALE_ALLOCATION"
    UNSCHEDULABLE = "UNSCHEDULABLE"
    NO_GPU = "NO_GPU"
    BAD_REQUEST = "BAD_REQUEST"
    NOT_CACHED = "NOT_CACHED"
    PREEMPTION_IMPOSSIBLE = "PREEMPTION_IMPOSSIBLE"
    DRA_ALLOCATED = "DRA_ALLOCATED"
    NAMESPACE_BUDGET = "NAMESPACE_BUDGET"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reason:
    """One reason a node cannot take a pod: a stable code and a sentence for people."""

    code: Code
    message: str


def join(reasons: tuple[Reason, ...]) -> str:
    """The reasons as one message (what the extender puts in `FailedNodes`)."""
    return "; ".join(reason.message for reason in reasons)
