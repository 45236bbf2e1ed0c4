"""Reloading the configuration while serving: ConfigMap symlink swaps, refusal keeps the last good one, metrics."""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import time
from typing import Any

import pytest
import yaml

from policies import model
from tests.conftest import PodFactory, ReviewFactory
from webhook import cli
from webhook.admission import app as admission_app
from webhook.admission import configwatch, keys
from webhook.serving import metrics

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples" / "policies"


class ConfigMapVolume:
    """A directory laid out as the kubelet mounts a ConfigMap: files are symlinks through ``..data``."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.generation = 0

    def publish(self, files: dict[str, str]) -> None:
        """Write a new timestamped directory and swap ``..data`` to it atomically, as the kubelet does."""
        self.generation += 1
        target = self.root / f"..2026_06_01_{self.generation:04d}"
        target.mkdir()
        for name, text in files.items():
            (target / name).write_text(text)
        temporary = self.root / "..data_tmp"
        temporary.symlink_to(target.name)
        os.replace(temporary, self.root / "..data")
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")

    def path(self, name: str) -> str:
        return str(self.root / name)


def watcher(source: configwatch.Source, *, clock: float = 1000.0) -> configwatch.Watcher:
    return configwatch.Watcher(
        source=source,
        live=keys.LiveSettings(current=configwatch.load(source)),
        meters=configwatch.register(metrics.Registry()),
        seen=configwatch.fingerprint(source),
        clock=lambda: clock,
    )


@pytest.fixture
def volume(tmp_path: pathlib.Path) -> ConfigMapVolume:
    mounted = ConfigMapVolume(tmp_path / "config")
    mounted.root.mkdir()
    mounted.publish({"config.yaml": "policies: {GPU002: {action: enforce}}\n"})
    return mounted


async def test_a_symlink_swap_of_the_mounted_configmap_is_picked_up(volume: ConfigMapVolume) -> None:
    watch = watcher(configwatch.Source(config_path=volume.path("config.yaml")), clock=2000.0)

    assert await watch.check() is False  # nothing changed
    volume.publish({"config.yaml": "policies: {GPU002: {action: warn}}\n"})

    assert await watch.check() is True
    assert watch.live.current.action("GPU002") is model.Action.WARN
    assert watch.meters.last_success.value() == 2000.0


async def test_an_invalid_configuration_is_refused_and_the_last_good_one_stays(
    volume: ConfigMapVolume, caplog: pytest.LogCaptureFixture
) -> None:
    watch = watcher(configwatch.Source(config_path=volume.path("config.yaml")))
    before = watch.live.current

    volume.publish({"config.yaml": "policies: {GPU002: {action: deny}}\n"})
    with caplog.at_level(logging.ERROR, logger="webhook.admission.configwatch"):
        assert await watch.check() is False
        assert await watch.check() is False  # the same broken content is reported once

    assert watch.live.current is before
    assert watch.meters.errors.value() == 1.0
    (record,) = caplog.records
    assert "policies.GPU002.action: must be one of enforce, warn, audit, off, got 'deny'" in record.getMessage()
    assert volume.path("config.yaml") in record.getMessage()

    volume.publish({"config.yaml": "policies: {GPU002: {action: audit}}\n"})
    assert await watch.check() is True
    assert watch.live.current.action("GPU002") is model.Action.AUDIT


@pytest.mark.parametrize(
    ("content", "line"),
    [
        ("trustZone: {hostPorts: ['9000-8000']}\n", "trustZone.hostPorts[0]: '9000-8000' is upside down"),
        ("trustZone: {gpuNodeLabels: ['not a key']}\n", "trustZone.gpuNodeLabels[0].key: 'not a key' is not a valid label key"),
    ],
)
async def test_a_bad_trust_zone_setting_is_refused_in_one_line_and_the_last_good_one_stays(
    volume: ConfigMapVolume, caplog: pytest.LogCaptureFixture, content: str, line: str
) -> None:
    watch = watcher(configwatch.Source(config_path=volume.path("config.yaml")))
    before = watch.live.current

    volume.publish({"config.yaml": content})
    with caplog.at_level(logging.ERROR, logger="webhook.admission.configwatch"):
        assert await watch.check() is False

    assert watch.live.current is before
    (record,) = caplog.records
    assert line in record.getMessage() and "\n" not in record.getMessage()


async def test_a_changed_policies_directory_is_reloaded_and_a_bad_expression_refused(tmp_path: pathlib.Path) -> None:
    policies = ConfigMapVolume(tmp_path / "policies")
    policies.root.mkdir()
    gpu_mem = (EXAMPLES / "gpu-mem-limit.yaml").read_text()
    policies.publish({"gpu-mem-limit.yaml": gpu_mem})
    watch = watcher(configwatch.Source(policies_dir=str(policies.root)))
    assert [p.id for p in watch.live.current.user_policies] == ["USR003"]

    policies.publish({"gpu-mem-limit.yaml": gpu_mem, "max-gpus.yaml": (EXAMPLES / "max-gpus-per-pod.yaml").read_text()})
    assert await watch.check() is True
    assert [p.id for p in watch.live.current.user_policies] == ["USR003", "USR001"]

    broken = yaml.safe_load(gpu_mem)
    broken["spec"]["validations"][0]["expression"] = "object.spec.containers.all(c,"
    policies.publish({"gpu-mem-limit.yaml": yaml.safe_dump(broken)})
    assert await watch.check() is False
    assert [p.id for p in watch.live.current.user_policies] == ["USR003", "USR001"]
    assert watch.meters.errors.value() == 1.0


async def test_a_deleted_file_is_refused_too(volume: ConfigMapVolume) -> None:
    watch = watcher(configwatch.Source(config_path=volume.path("config.yaml")))

    os.unlink(volume.path("config.yaml"))

    assert await watch.check() is False
    assert watch.meters.errors.value() == 1.0


async def test_the_running_webhook_switches_to_the_new_configuration(
    aiohttp_client: Any, volume: ConfigMapVolume, make_pod: PodFactory, make_review: ReviewFactory
) -> None:
    source = configwatch.Source(config_path=volume.path("config.yaml"))
    app = admission_app.make_app(configwatch.load(source))
    app.cleanup_ctx.append(configwatch.watch(source, interval_s=0.01))
    client = await aiohttp_client(app)
    review = make_review(make_pod(limits={"nvidia.com/gpu": 1}, privileged=True))

    async def allowed() -> bool:
        answer = await (await client.post("/validate", json=review)).json()
        return bool(answer["response"]["allowed"])

    assert await allowed() is False
    volume.publish({"config.yaml": "policies: {GPU002: {action: warn}}\n"})
    deadline = time.monotonic() + 10
    while not await allowed():
        assert time.monotonic() < deadline, "the new configuration was not picked up"
        await asyncio.sleep(0.01)

    text = await (await client.get("/metrics")).text()
    assert "# TYPE gpu_admission_config_last_reload_success_timestamp_seconds gauge" in text
    assert "gpu_admission_config_reload_errors_total 0.0" in text


def test_dry_run_takes_the_policies_directory(capsys: pytest.CaptureFixture[str]) -> None:
    denied = str(EXAMPLES / "manifests" / "gpu-mem-limit-denied.yaml")

    assert cli.main(["dry-run", "-f", denied]) == 0
    assert cli.main(["dry-run", "-f", denied, "--policies-dir", str(EXAMPLES)]) == 1
    assert "USR003: containers ask for at most 16 GiB of GPU memory" in capsys.readouterr().out


def test_dry_run_reads_namespace_labels_from_namespace_documents(tmp_path: pathlib.Path) -> None:
    settings_file = tmp_path / "config.yaml"
    settings_file.write_text(
        "namespaceOverrides: [{namespaceSelector: {matchLabels: {tier: lab}}, policies: {GPU002: {action: warn}}}]\n"
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "lab-a"},
        "spec": {
            "containers": [{"name": "c", "securityContext": {"privileged": True}, "resources": {"limits": {"nvidia.com/gpu": 1}}}]
        },
    }
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "lab-a", "labels": {"tier": "lab"}}}
    alone, together = tmp_path / "alone.yaml", tmp_path / "together.yaml"
    alone.write_text(yaml.safe_dump(pod))
    together.write_text(yaml.safe_dump_all([namespace, pod]))

    assert cli.main(["dry-run", "--config", str(settings_file), "-f", str(alone)]) == 1
    assert cli.main(["dry-run", "--config", str(settings_file), "-f", str(together)]) == 0
