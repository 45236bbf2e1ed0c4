"""The labeling loop: read the cards, compute the labels, publish what changed; every interval.

The runner holds the only state of the labeler: the last good inventory (kept through transient read
errors, so labels never flap on a hiccup) and the last problem it logged (so a problem that persists
is logged once, not every interval, and its end is logged once too).

What one pass does when things go wrong:

| situation | what is written | outcome |
|---|---|---|
| no NVML (no library, no driver) and never read before | nothing | `NO_NVML` |
| a transient read error (or NVML vanished) after a good read | the last good inventory, again | `READ_FAILED` |
| a transient read error and no good read yet | nothing | `READ_FAILED` |
| the node does not exist | nothing | `NODE_MISSING` |
| the apiserver fails | what got through | `API_FAILED` |

Real use (`policies.gpu.usage`): when the runner is given a pod lister, each pass also maps the
cards' processes to the pods of this node (`attribution`, through the processes' cgroups under
`proc_root`) and writes the summary annotation `gpu-admission.io/gpu-usage`, rate-limited: only
when `usage.significant` finds a change against the summary on the Node, and at most once per
`usage_interval_s`. A pending change waits for the interval and is written by the first pass
after it. Where the source knows nothing of use (an inventory file without `usedMiB` or
`processes`) nothing is written; where listing the pods fails the last summary stays.

Per pod (`podusage`): each pass that attributes processes also compares each pod's memory per card
with its allocation (`pod_figures`, published on `/metrics`) and hands the figures to the limits
(`limits`, when given). The figures are stale (`usage_stale` says why) when this pass could not
read the cards, could not list the pods, or could not read some process's cgroup: the metrics say
so and the limits do nothing on a stale pass.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from policies import gpu
from policies.gpu import usage
from webhook.kube import errors as kube_errors
from webhook.labeler import attribution, cgroups, inventory, labels, limits, nvml, ownership, podusage, store

logger = logging.getLogger(__name__)

CONFLICT_RETRIES = 3


class Outcome(enum.StrEnum):
    """What one pass ended with."""

    CHANGED = "changed"  # something was patched
    UNCHANGED = "unchanged"  # the node already carried everything
    NO_NVML = "no-nvml"
    READ_FAILED = "read-failed"
    NODE_MISSING = "node-missing"
    API_FAILED = "api-failed"


class Source(Protocol):
    """Where the cards come from: NVML or an inventory file.

    Raises nvml.Unavailable (no NVML at all), or nvml.ReadError / inventory.InventoryError (this read
    failed; try again later).
    """

    def __call__(self) -> inventory.Inventory: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
    node_name: str
    interval_s: float = 60.0
    advertise: bool = False
    take_over: bool = False
    usage_interval_s: float = 60.0  # the least time between two writes of the usage summary
    proc_root: Path = cgroups.DEFAULT_PROC_ROOT


class Runner:
    """One node's labeler. `step()` is one pass; `run()` repeats it until stopped."""

    def __init__(
        self,
        *,
        source: Source,
        nodes: store.Nodes,
        options: Options,
        clock: Callable[[], float] = time.monotonic,
        pods: store.Pods | None = None,
        wall_clock: Callable[[], float] = time.time,
        enforcer: limits.Enforcer | None = None,
    ) -> None:
        self._source = source
        self._nodes = nodes
        self._options = options
        self._clock = clock
        self._pods = pods
        self._wall_clock = wall_clock
        self._usage_written_at: float | None = None
        self.usage_writes = 0
        self.last_usage: usage.NodeUsage | None = None  # the last summary computed (written or not)
        self._enforcer = enforcer
        self._read_fresh = False
        # Per pod and card (for /metrics and the limits): the last figures, why they are stale
        # ("" when this pass read them), and the wall time of the last pass that read them.
        self.pod_figures: tuple[podusage.PodCard, ...] = ()
        self.usage_stale = "no pass yet"
        self.usage_read_wall: float | None = None
        self._last_good: inventory.Inventory | None = None
        self._problem: str | None = None
        self._notes: dict[str, str] = {}
        self.passes = 0
        self.last_pass_at: float | None = None
        self.last_outcome: Outcome | None = None
        # For /metrics: passes by outcome, and the wall time of the last pass that wrote the node
        # or found it already right (an alert on its age catches a labeler that stopped writing).
        self.outcomes: dict[Outcome, int] = {}
        self.last_success_wall: float | None = None

    @property
    def options(self) -> Options:
        return self._options

    @property
    def enforcer(self) -> limits.Enforcer | None:
        return self._enforcer

    def step(self) -> Outcome:
        """One pass: read, compute, publish. Never raises for NVML or apiserver trouble."""
        outcome = self._step()
        self.passes += 1
        self.last_pass_at = self._clock()
        self.last_outcome = outcome
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if outcome in (Outcome.CHANGED, Outcome.UNCHANGED):
            self.last_success_wall = self._wall_clock()
        return outcome

    def run(self, *, stop: threading.Event) -> None:
        """Pass every interval until `stop` is set (a pass in progress finishes first)."""
        logger.info(
            "labeling node %s every %ss%s%s",
            self._options.node_name,
            f"{self._options.interval_s:g}",
            ", advertising capacity" if self._options.advertise else "",
            ", taking over aliyun.accelerator labels" if self._options.take_over else "",
        )
        while not stop.is_set():
            self.step()
            stop.wait(self._options.interval_s)

    # --- one pass ---------------------------------------------------------------------------------

    def _step(self) -> Outcome:
        inv, read_outcome = self._read()
        self._read_fresh = read_outcome is None
        if inv is None:
            assert read_outcome is not None
            self.usage_stale = "the GPUs could not be read"
            return read_outcome
        try:
            changed = self._publish(inv)
        except kube_errors.NotFound as error:
            self._report(f"node {self._options.node_name} not found ({error}); will look again next interval")
            return Outcome.NODE_MISSING
        except kube_errors.KubeError as error:
            self._report(f"apiserver: {error}; will retry next interval")
            return Outcome.API_FAILED
        if read_outcome is None:
            self._recovered()
            return Outcome.CHANGED if changed else Outcome.UNCHANGED
        return read_outcome

    def _read(self) -> tuple[inventory.Inventory | None, Outcome | None]:
        """The inventory to publish, and the failure outcome if this read failed."""
        try:
            inv = self._source()
        except nvml.Unavailable as error:
            if self._last_good is None:
                self._report(
                    f"NVML is not available on this node ({error}): writing no labels; "
                    f"checking again every {self._options.interval_s:g}s"
                )
                return None, Outcome.NO_NVML
            self._report(f"NVML went away ({error}): keeping the last good labels")
            return self._last_good, Outcome.READ_FAILED
        except (nvml.ReadError, inventory.InventoryError) as error:
            kept = "keeping the last good labels" if self._last_good is not None else "writing nothing yet"
            self._report(f"reading the GPUs failed ({error}): {kept}")
            return self._last_good, Outcome.READ_FAILED
        self._last_good = inv
        return inv, None

    def _publish(self, inv: inventory.Inventory) -> bool:
        desired = labels.compute(inv)
        name = self._options.node_name
        changed = False
        for attempt in range(1, CONFLICT_RETRIES + 1):
            node = self._nodes.get(name)
            plan = ownership.plan(node, desired=desired, take_over=self._options.take_over)
            self._note(
                "foreign",
                f"leaving {', '.join(plan.foreign)} alone: another component owns them (use --take-over to replace them)"
                if plan.foreign
                else "",
            )
            if plan.patch is None:
                break
            try:
                self._nodes.patch(name, plan.patch)
            except kube_errors.Conflict:
                if attempt == CONFLICT_RETRIES:
                    raise
                logger.debug("node %s changed while labeling it; reading it again", name)
                continue
            logger.info("node %s: %s", name, _describe(plan.patch))
            changed = True
            break
        if self._options.advertise:
            changed = self._advertise(node, inv) or changed
        if self._pods is not None:
            changed = self._publish_usage(node, inv) or changed
        return changed

    def _publish_usage(self, node: ownership.Node, inv: inventory.Inventory) -> bool:
        """Write the usage summary when it changed significantly and the interval allows."""
        on_node = node.annotations.get(usage.USAGE_ANNOTATION)
        if not any(card.used_mib is not None or card.processes for card in inv.cards):
            self.pod_figures, self.usage_stale = (), "the cards report no use"
            if on_node is None:
                return False
            self._nodes.patch(node.name, {"metadata": {"annotations": {usage.USAGE_ANNOTATION: None}}})
            logger.info("node %s: removed annotations %s (no usage known)", node.name, usage.USAGE_ANNOTATION)
            return True
        assert self._pods is not None
        listed: list[Mapping[str, Any]] = []
        # No process, nothing to attribute: no list; unless the limits watch a pod above its
        # request, whose processes may just have ended (it then gets its Event back under).
        watching = self._enforcer is not None and bool(self._enforcer.above())
        if any(card.processes for card in inv.cards) or watching:
            try:
                listed = self._pods.pods_on(node.name)
            except kube_errors.KubeError as error:
                self._note("pods", f"listing the pods of node {node.name} failed ({error}): the usage summary is not updated")
                self.usage_stale = "listing the node's pods failed"
                return False
            self._note("pods", "")
        proc_root = self._options.proc_root
        if any(card.processes for card in inv.cards):
            self._note(
                "proc",
                ""
                if proc_root.is_dir()
                else f"process attribution is off: {proc_root} (--proc-root, the host's /proc) is not there; GPU processes are "
                "published as unknown (deploy/components/process-attribution mounts the host's /proc)",
            )
        summary = attribution.summarise(
            inv,
            pods=[attribution.PodRef.from_object(pod) for pod in listed],
            identify=lambda pid: cgroups.read(pid, proc_root=proc_root),
            now=self._wall_clock(),
        )
        self.last_usage = summary
        self._judge_pods(node, summary, listed, attributing=proc_root.is_dir() or not any(card.processes for card in inv.cards))
        reason = usage.significant(usage.parse(on_node), summary)
        if not reason:
            return False
        now = self._clock()
        if self._usage_written_at is not None and now - self._usage_written_at < self._options.usage_interval_s:
            logger.debug("node %s: usage changed (%s); waiting for the interval", node.name, reason)
            return False
        self._nodes.patch(node.name, {"metadata": {"annotations": {usage.USAGE_ANNOTATION: usage.render(summary)}}})
        self._usage_written_at = now
        self.usage_writes += 1
        out_of_band = sum(len(card.out_of_band) for card in summary.cards)
        logger.info("node %s: usage summary written (%s; %d out-of-band process(es))", node.name, reason, out_of_band)
        return True

    def _judge_pods(
        self, node: ownership.Node, summary: usage.NodeUsage, listed: list[Mapping[str, Any]], *, attributing: bool
    ) -> None:
        """Each pod's figures against its allocation, whether they are fresh, and the limits' turn."""
        unknown = sum(len(card.unknown) for card in summary.cards)
        if not self._read_fresh:
            stale = "the GPUs could not be read: the figures are from the last good read"
        elif not attributing:
            stale = "process attribution is off (no host /proc)"
        elif unknown:
            stale = f"the cgroups of {unknown} GPU process(es) could not be read"
        else:
            stale = ""
        self.pod_figures = podusage.figures(
            summary, listed, node=node.name, mode=gpu.mode_of(node.labels), now=self._wall_clock()
        )
        self.usage_stale = stale
        if not stale:
            self.usage_read_wall = self._wall_clock()
        if self._enforcer is not None:
            self._enforcer.step(self.pod_figures, fresh=not stale, now=self._clock())

    def _advertise(self, node: ownership.Node, inv: inventory.Inventory) -> bool:
        mode = gpu.mode_of(node.labels)
        if mode is None:
            value = node.labels.get(gpu.SCHEDULE_LABEL, "")
            self._note(
                "mode", f'node {node.name} has {gpu.SCHEDULE_LABEL}="{value}", which is no GPU mode; leaving its capacity alone'
            )
            return False
        self._note("mode", "")
        patch = ownership.capacity_patch(node, want=labels.capacity(inv, mode=mode))
        if patch is None:
            return False
        self._nodes.patch_status(node.name, patch)
        logger.info("node %s: advertised for mode %s: %s", node.name, mode, patch["status"].get("capacity", patch["status"]))
        return True

    # --- logging each problem once ----------------------------------------------------------------

    def _report(self, problem: str) -> None:
        if problem != self._problem:
            logger.warning("%s", problem)
            self._problem = problem

    def _recovered(self) -> None:
        if self._problem is not None:
            logger.info("recovered: the node is labeled again")
            self._problem = None

    def _note(self, topic: str, message: str) -> None:
        if message and self._notes.get(topic) != message:
            logger.warning("%s", message)
        self._notes[topic] = message


def _describe(patch: Mapping[str, Any]) -> str:
    metadata = patch.get("metadata", {})
    parts = []
    for section in ("labels", "annotations"):
        entries = metadata.get(section, {})
        if entries:
            set_keys = sorted(key for key, value in entries.items() if value is not None)
            removed = sorted(key for key, value in entries.items() if value is None)
            if set_keys:
                parts.append(f"set {section} {', '.join(set_keys)}")
            if removed:
                parts.append(f"removed {section} {', '.join(removed)}")
    return "; ".join(parts) or "no change"
