"""GPU211: no ConfigMap or Secret delivers a GPU environment variable through envFrom.

A source fails (enforced) when a container's `envFrom` of it delivers a guarded name
(`gpu.GUARDED_ENV`: `NVIDIA_VISIBLE_DEVICES` and the cGPU/gpushare isolation variables, GPU007's
list) as the entry's prefix plus one of its keys, not overridden by the container's own `env` (env
beats envFrom); the finding names the pods and templates taking it. A source with a guarded key
that no container takes yet is a warning: one could. Keys and names only, never a value: the scan
holds sources reduced to their keys (`envsources.keys_only`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from policies import envsources, gpu, model, podspec
from webhook.audit import findings
from webhook.audit.checks import base, facts

_SOURCE_REF = {"ConfigMap": "configMapRef", "Secret": "secretRef"}


def takers(
    source: Mapping[str, Any], *, consumers: Iterable[Mapping[str, Any]]
) -> list[tuple[findings.ObjectRef, str, tuple[str, ...]]]:
    """(object, container label, guarded names) for every container of `consumers` (Pods and
    workloads of the source's namespace) whose envFrom of `source` delivers a guarded name: the
    prefix plus a key of the source, not set by the container's own env (env beats envFrom)."""
    field = _SOURCE_REF.get(str(source.get("kind")))
    source_name = facts.name_of(source)
    source_keys = envsources.keys(source)
    if field is None or not source_keys:
        return []
    found: list[tuple[findings.ObjectRef, str, tuple[str, ...]]] = []
    for obj in consumers:
        template = podspec.template(obj)
        if template is None or (template.is_pod and not facts.active(obj)):
            continue
        for ref in podspec.iter_containers(template.spec, spec_path=""):
            in_env = {e.get("name") for e in podspec.env_entries(ref.container)}
            delivered: set[str] = set()
            for entry in podspec.sequence(ref.container.get("envFrom")):
                entry = podspec.mapping(entry)
                if str(podspec.mapping(entry.get(field)).get("name", "")) != source_name:
                    continue
                prefix = entry.get("prefix")
                prefix = prefix if isinstance(prefix, str) else ""
                delivered.update(
                    prefix + key for key in source_keys if prefix + key in gpu.GUARDED_ENV and prefix + key not in in_env
                )
            if delivered:
                found.append((findings.ObjectRef.of(obj), ref.label, tuple(sorted(delivered))))
    return found


class GuardedEnvSource(base.EnvSourceCheck):
    """ConfigMaps and Secrets that carry, or deliver through envFrom, a GPU environment name."""

    id = "GPU211"
    rule = "guarded-env-source"
    summary = "no ConfigMap or Secret delivers a GPU environment variable through envFrom"
    severity = findings.Severity.HIGH
    category = "GPU Security"
    action = model.Action.ENFORCE

    def check_source(self, source: Mapping[str, Any], context: base.EnvSourceContext) -> findings.Finding | None:
        """None where the source neither has a guarded key nor delivers one; no pass result."""
        keys = envsources.guarded_keys(source)
        taken = takers(source, consumers=context.consumers)
        if not keys and not taken:
            return None
        subject = findings.ObjectRef.of(source)
        own = f"it has the key{'s' if len(keys) > 1 else ''} {', '.join(keys)}" if keys else ""
        if not taken:
            return self.finding(
                subject,
                result=model.Result.WARN,
                detail=f"{own}; no container takes it by envFrom yet, but one could: rename or remove "
                f"{'them' if len(keys) > 1 else 'it'} (GPU007 refuses every further write while it stays)",
            )
        described = [f"{ref.display} {label} gets {', '.join(names)}" for ref, label, names in taken]
        shown = "; ".join(base.shortened(described))
        related = list(dict.fromkeys(ref for ref, _, _ in taken))[: base.MAX_RELATED]
        detail = f"{own + '; ' if own else ''}envFrom delivers it: {shown}; rename the keys, or change the envFrom prefix"
        return self.finding(subject, result=model.Result.FAIL, detail=detail, related=related)
