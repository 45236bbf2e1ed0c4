"""GPU214: a pod's processes hold no more GPU memory than it asked for, and only on its own card.

From the labeler's usage summary, for a running pod whose processes appear in it: on `share`, which
does not isolate memory, any excess over the request fails; on the other shared modes, excess beyond
the tolerance (`facts.usage_tolerance_mib`). Memory on a card the pod was not given fails, and so
does any memory of a pod that asks for no GPU. Pods given whole cards (`nvidia.com/gpu`,
`aliyun.com/gpu`) may use all of them and are judged only on using a card that is not theirs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import gpu, model, podspec
from webhook.audit import findings
from webhook.audit.checks import base, facts


class PodExceedsRequest(base.PodCheck):
    """Pods using more GPU memory than they asked for, or another card."""

    id = "GPU214"
    rule = "pod-exceeds-request"
    summary = "a pod's processes hold no more GPU memory than it asked for, and only on its own card"
    severity = findings.Severity.MEDIUM
    category = "GPU Usage"
    action = model.Action.WARN

    def check_pod(self, pod: Mapping[str, Any], context: base.PodContext) -> findings.Finding | None:
        """None unless the pod runs and its processes appear in its node's usage summary."""
        node = context.node
        if node is None:
            return None
        summary = facts.node_usage(node)  # most nodes have none: nothing to read off the pod then
        if summary is None or not facts.active(pod):
            return None
        uid = str(podspec.mapping(pod.get("metadata")).get("uid") or "")
        if not uid:
            return None
        held = summary.pod_mib(uid)
        if not held:
            return None
        subject = findings.ObjectRef.of(pod)
        spec = podspec.mapping(pod.get("spec"))
        found = context.parses.allocation(pod, now=context.now)
        request = context.parses.request(pod)
        node_mode = facts.mode(node)
        problems: list[str] = []
        if found is not None and found.node == facts.name_of(node):
            own = set(found.cards)
            for index, mib in sorted(held.items()):
                if index not in own:
                    problems.append(
                        f"its processes hold {mib} MiB on card {index}, which it was not given "
                        f"(its allocation: card {facts.card_list(found)})"
                    )
            if not found.whole:
                allowed = found.memory_gib * gpu.MIB_PER_GIB
                for index in sorted(own):
                    mib = held.get(index, 0)
                    limit = allowed if node_mode is gpu.Mode.SHARE else allowed + facts.usage_tolerance_mib(allowed)
                    if mib > limit:
                        how = (
                            "share does not isolate memory"
                            if node_mode is gpu.Mode.SHARE
                            else f"beyond the tolerance of {limit - allowed} MiB"
                        )
                        problems.append(
                            f"its processes hold {mib} MiB on card {index} but it asked for "
                            f"{found.memory_gib} GiB ({allowed} MiB; {how})"
                        )
        elif not gpu.pod_requests_gpu(spec):
            listed = ", ".join(f"{mib} MiB on card {index}" for index, mib in sorted(held.items()))
            problems.append(f"it asks for no GPU but its processes hold {listed}")
        elif request.managed and not request.cards and not request.problem:
            allowed = request.memory_gib * gpu.MIB_PER_GIB
            for index, mib in sorted(held.items()):
                if mib > allowed + (0 if node_mode is gpu.Mode.SHARE else facts.usage_tolerance_mib(allowed)):
                    problems.append(
                        f"its processes hold {mib} MiB on card {index} but it asked for {request.memory_gib} GiB "
                        "and holds no allocation"
                    )
        if problems:
            return self.finding(
                subject,
                result=model.Result.FAIL,
                detail=f"on node {facts.name_of(node)}: "
                + "; ".join(problems)
                + "; ask for what the job needs, or cap its memory",
                related=[facts.node_ref(node)],
            )
        used = ", ".join(f"{mib} MiB on card {index}" for index, mib in sorted(held.items()))
        return self.finding(subject, result=model.Result.PASS, detail=f"uses {used}")
