"""GPU213: every process on a GPU belongs to a pod the scheduler accounted for.

From the labeler's usage summary (`policies.gpu.usage`): a process that holds a card but belongs to no
pod the apiserver has on the node (`docker run --gpus`, `ctr run`, a host process, a static pod
without a mirror pod, a leftover of a pod that is gone) is the bypass admission cannot see. The
finding names the card, PID, memory and, where the cgroup shows one, the container ID. Enforced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import model
from policies.gpu import usage
from webhook.audit import findings
from webhook.audit.checks import base, facts


def _mib(value: int | None) -> str:
    return "? MiB" if value is None else f"{value} MiB"


class OutOfBandProcesses(base.NodeCheck):
    """GPU processes outside any pod of the node."""

    id = "GPU213"
    rule = "out-of-band-gpu-process"
    summary = "every process on a GPU belongs to a pod the scheduler accounted for"
    severity = findings.Severity.HIGH
    category = "GPU Usage"
    action = model.Action.ENFORCE

    def check_node(self, node: Mapping[str, Any], context: base.NodeContext) -> findings.Finding | None:
        """None for a node without a usage summary."""
        summary = facts.node_usage(node)
        if summary is None:
            return None
        subject = facts.node_ref(node)
        problems: list[str] = []
        for card in summary.cards:
            for entry in card.out_of_band:
                where = f"card {card.index}: pid {entry.pid} holds {_mib(entry.used_mib)}"
                if entry.pod_uid:
                    where += (
                        f" in the cgroup of pod UID {entry.pod_uid}, which the apiserver does not have on this node "
                        "(a static pod without a mirror pod, or a pod that is gone)"
                    )
                elif entry.container_id:
                    where += f" in container {entry.container_id[:12]}, started on the node outside Kubernetes"
                else:
                    where += ", a process outside any container"
                problems.append(where)
            # `truncated` counts what every list left out, pods' and unattributable ("unknown", e.g. a
            # labeler without the host's /proc) processes' too: only a full out-of-band list says
            # that some of them are out-of-band.
            if card.truncated and len(card.out_of_band) >= usage.MAX_ENTRIES:
                problems.append(f"card {card.index}: {card.truncated} more process(es) not listed in the summary")
        if problems:
            detail = (
                f"on node {facts.name_of(node)}: "
                + "; ".join(base.shortened(problems))
                + "; the scheduler does not count this memory: stop it, or run it as a pod that asks for the GPU"
            )
            return self.finding(subject, result=model.Result.FAIL, detail=detail)
        return self.finding(subject, result=model.Result.PASS, detail="every GPU process belongs to a pod of this node")
