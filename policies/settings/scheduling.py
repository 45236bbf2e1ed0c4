"""`scheduler`, `gpuSchedulerName` and `extenderSchedulers`: the GPU scheduler this is the gate in front of."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import schedulers
from policies.settings import shapes

# The schedulerName the apiserver gives a pod that names none; deploy/scheduler-config.yaml extends it.
DEFAULT_SCHEDULER = schedulers.DEFAULT_SCHEDULER_NAME


def scheduler_name(value: object) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise shapes.InvalidSettings(f"gpuSchedulerName: must be a string, got {value!r}")
    return value.strip()


def extender_schedulers(value: object) -> tuple[str, ...]:
    if value is None:
        return (DEFAULT_SCHEDULER,)
    names = shapes.strings(value, field="extenderSchedulers", allow_empty_list=True)
    if not all(name.strip() for name in names):
        raise shapes.InvalidSettings(f"extenderSchedulers: must be a list of non-empty strings, got {value!r}")
    return tuple(dict.fromkeys(name.strip() for name in names))


_PROFILE_NAMES = ", ".join(schedulers.Name)


def scheduler(value: object) -> schedulers.Scheduler:
    """`scheduler`: a profile name, or {profile, writers}; writers default to the scheduler's chart's."""
    if value is None:
        return schedulers.DEFAULT_SCHEDULER
    entry: Mapping[str, Any] = {"profile": value} if isinstance(value, str) else shapes.mapping(value)
    if not entry:
        raise shapes.InvalidSettings(
            f"scheduler: must be a profile name ({_PROFILE_NAMES}) or a mapping with profile and writers, got {value!r}"
        )
    shapes.keys(entry, field="scheduler", known=("profile", "writers"))
    field = "scheduler" if isinstance(value, str) else "scheduler.profile"
    name = entry.get("profile")
    if name not in tuple(schedulers.Name):
        raise shapes.InvalidSettings(f"{field}: unknown scheduler profile {name!r}; known: {_PROFILE_NAMES}")
    profile = schedulers.PROFILES[schedulers.Name(name)]
    if entry.get("writers") is None:
        return schedulers.Scheduler(profile=profile, writers=profile.default_writers)
    if not profile.writer_annotations:
        raise shapes.InvalidSettings(
            f"scheduler.writers: the {profile.name} profile has no device annotations for anyone to write"
        )
    writers: list[schedulers.ServiceAccount] = []
    for where, writer in shapes.entries(
        entry["writers"],
        field="scheduler.writers",
        known=("namespace", "serviceAccount"),
        shape="{namespace: ..., serviceAccount: ...}",
    ):
        namespace, account = writer.get("namespace"), writer.get("serviceAccount")
        if not isinstance(namespace, str) or not schedulers.is_namespace_name(namespace):
            raise shapes.InvalidSettings(
                f"{where}.namespace: is required, the namespace of the service account (a namespace name), got {namespace!r}"
            )
        if not isinstance(account, str) or not schedulers.is_service_account_name(account):
            raise shapes.InvalidSettings(f"{where}.serviceAccount: is required, a service account name, got {account!r}")
        writers.append(schedulers.ServiceAccount(namespace=namespace, name=account))
    return schedulers.Scheduler(profile=profile, writers=tuple(dict.fromkeys(writers)))
