"""The built-in policies, registered explicitly: one module each, listed here in ID order.

Adding a policy means writing its module and adding an instance to POLICIES; nothing registers
itself on import.
"""

from __future__ import annotations

from policies import policy
from policies.builtin import (
    gpu001_visible_devices,
    gpu002_privileged,
    gpu003_host_path,
    gpu004_resources,
    gpu005_mode_agreement,
    gpu006_device_list_mounts,
    gpu007_env_sources,
    gpu008_extender_bypass,
    gpu009_ephemeral_privilege,
    gpu010_device_annotations,
    gpu011_dra_claims,
    gpu012_mps_memory_limit,
    gpu013_budget_gate_kept,
    gpu014_budget_fit,
    gpu101_schedule_mode,
    gpu102_card_model,
    gpu103_off_gpu_nodes,
    gpu104_void_devices,
    gpu105_scheduler_name,
    gpu106_mps_memory_limit,
    gpu107_budget_gate,
)

POLICIES: tuple[policy.Policy, ...] = (
    gpu001_visible_devices.VisibleDevices(),
    gpu002_privileged.PrivilegedOnGpu(),
    gpu003_host_path.HostPathDevices(),
    gpu004_resources.WellFormedResources(),
    gpu005_mode_agreement.ModeAgreement(),
    gpu006_device_list_mounts.DeviceListMounts(),
    gpu007_env_sources.EnvSourceKeys(),
    gpu008_extender_bypass.ExtenderBypass(),
    gpu009_ephemeral_privilege.EphemeralPrivilege(),
    gpu010_device_annotations.DeviceAnnotations(),
    gpu011_dra_claims.DraClaims(),
    gpu012_mps_memory_limit.MpsMemoryLimitEnv(),
    gpu013_budget_gate_kept.BudgetGateKept(),
    gpu014_budget_fit.BudgetFit(),
    gpu101_schedule_mode.ScheduleMode(),
    gpu102_card_model.CardModel(),
    gpu103_off_gpu_nodes.OffGpuNodes(),
    gpu104_void_devices.VoidDevices(),
    gpu105_scheduler_name.SchedulerName(),
    gpu106_mps_memory_limit.MpsMemoryLimit(),
    gpu107_budget_gate.BudgetGate(),
)
