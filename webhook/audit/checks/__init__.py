"""The audit's consistency checks, registered explicitly: one module each, listed here in ID order.

These are what no admission policy can judge: they need the node, or every pod at once. IDs are
stable and continue the built-in policies' numbering:

| id | rule | judges | fails when |
|---|---|---|---|
| GPU201 | gpu-access-without-request | Pod on a GPU node | it requests no GPU but can reach the cards: a privileged container (or one adding SYS_ADMIN/ALL, ephemeral debug containers included), a hostPath on GPU devices or sockets, NVIDIA_VISIBLE_DEVICES set to something but void/none (certain); or a container without NVIDIA_VISIBLE_DEVICES=void, which an image default of `all` would expose (uncertain: warn) |
| GPU202 | card-overcommitted | GPU node | the pods' allocation annotations give one card more memory, more core percentage or more whole-card holders than it has |
| GPU203 | orphaned-reservation | Pod with an allocation, GPU node with a ledger | it holds a card reservation but is not bound to that node: no `spec.nodeName`, another node, or it has finished |
| GPU204 | missing-card | Pod with an allocation | its card index does not exist on its node (fewer cards now, or the node is gone) |
| GPU205 | mode-resource-mismatch | GPU node | it advertises a non-zero resource of another mode than its `ack.node.gpu.schedule` (or the mode is unknown) |
| GPU206 | card-model-labels | GPU node | a card-model label (`aliyun.accelerator/nvidia_name`, `_mem`, `_count`) is missing |
| GPU207 | mode-selector | Pod or workload asking for `aliyun.com/gpu-mem` | its nodeSelector/required affinity does not pin one `ack.node.gpu.schedule` |
| GPU208 | mode-resource-missing | GPU node | it advertises none of its own mode's resource (the device plugin is likely not running) |
| GPU209 | expired-exception | an exception in the settings file | its `expires` has passed |
| GPU210 | unaccounted-gpu-pod | bound Pod asking for an extender-managed resource | it holds no card allocation, or one that does not match its request |
| GPU211 | guarded-env-source | ConfigMap or Secret | a key is a GPU environment name, or a pod or template takes one by envFrom with a prefix (fails when a container's envFrom delivers it, warns when none does yet) |
| GPU212 | stale-allocation | GPU node | cards are still held by pods that are gone, or Terminating long past their deadline |
| GPU213 | out-of-band-gpu-process | GPU node with the labeler's usage summary | a process holds a card but belongs to no pod the apiserver has on the node |
| GPU214 | pod-exceeds-request | Pod with GPU processes in the usage summary | its processes hold more memory than it asked for, or memory on a card it was not given |
| GPU215 | card-use-exceeds-allocations | shared-mode card with the usage summary | its processes hold more than its allocations add up to, beyond the tolerance |
| GPU216 | dra-double-booking | GPU node with cards DRA claims hold | a card an allocated ResourceClaim holds (matched by UUID) is also allocated by the extender |
| GPU217 | unrecognised-gpu-node | Node with GPU capacity or allocatable | none of the GPU node labels (`trustzone.DEFAULT_GPU_NODE_LABELS`, `trustZone.gpuNodeLabels`) marks it, so GPU103's affinity does not keep pods with node power off it |
| GPU218 | namespace-over-budget | Namespace with a GPU budget (`gpuBudgets`) | it holds more GPU memory (or whole cards) than its budget: a budget lowered below what it holds, or pods placed around the extender |
| GPU219 | unknown-budget-charge | Pod or DRA ResourceClaim of a budgeted namespace | its GPU memory charge cannot be computed (`Charge.problem`: card memory nothing states, a device without a `memory` capacity) |

DRA claims themselves are judged by the admission policy GPU011, which the audit runs on every
ResourceClaim and ResourceClaimTemplate (a GPU class in a namespace not granted it; adminAccess
outside the admin namespaces) and on the pods that use them.

Each module's docstring says more. Actions are fixed: GPU201, GPU202, GPU204, GPU205, GPU210,
GPU211, GPU213, GPU216 and GPU217 are `enforce` (cards are reachable, double-booked or used outside the accounting
right now), the rest `warn`. A "GPU node" carries a GPU label (`ack.node.gpu.*`,
`aliyun.accelerator/*`, `gpu-admission.io/gpu-memory-mib`), the labeler's inventory annotation,
or non-zero GPU capacity (`facts.is_gpu_node`). GPU218 and GPU219 judge only namespaces that
have a budget, and only in whole-cluster audits.

Adding a check means writing its module (a class on the base of the kind it judges, `base`) and
adding an instance to CHECKS; nothing registers itself on import, and the scan runs every check
of each kind from this list.
"""

from __future__ import annotations

from webhook.audit.checks import (
    base,
    gpu201_gpu_access,
    gpu202_card_overcommit,
    gpu203_orphaned_reservation,
    gpu204_missing_card,
    gpu205_mode_resources,
    gpu206_card_model_labels,
    gpu207_mode_selector,
    gpu208_mode_resource_missing,
    gpu209_expired_exception,
    gpu210_unaccounted_pod,
    gpu211_env_source,
    gpu212_stale_allocation,
    gpu213_out_of_band,
    gpu214_pod_over_request,
    gpu215_card_over_allocation,
    gpu216_dra_double_booking,
    gpu217_unrecognised_gpu_node,
    gpu218_namespace_over_budget,
    gpu219_unknown_charge,
)

CHECKS: tuple[base.Check, ...] = (
    gpu201_gpu_access.GpuAccessWithoutRequest(),
    gpu202_card_overcommit.CardOvercommitted(),
    gpu203_orphaned_reservation.OrphanedReservation(),
    gpu204_missing_card.MissingCard(),
    gpu205_mode_resources.ModeResourceMismatch(),
    gpu206_card_model_labels.CardModelLabels(),
    gpu207_mode_selector.ModeSelector(),
    gpu208_mode_resource_missing.ModeResourceMissing(),
    gpu209_expired_exception.ExpiredException(),
    gpu210_unaccounted_pod.UnaccountedGpuPod(),
    gpu211_env_source.GuardedEnvSource(),
    gpu212_stale_allocation.StaleAllocation(),
    gpu213_out_of_band.OutOfBandProcesses(),
    gpu214_pod_over_request.PodExceedsRequest(),
    gpu215_card_over_allocation.CardUseExceedsAllocations(),
    gpu216_dra_double_booking.DraDoubleBooking(),
    gpu217_unrecognised_gpu_node.UnrecognisedGpuNode(),
    gpu218_namespace_over_budget.NamespaceOverBudget(),
    gpu219_unknown_charge.UnknownCharge(),
)
