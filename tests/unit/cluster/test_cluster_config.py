"""The pure parts of the local cluster: node files, Node manifests and webhook registrations."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from webhook.cluster import install, nodes


def test_the_default_node_set_mirrors_the_seed_pools() -> None:
    fake = {node.name: node for node in nodes.load(None)}
    modes = sorted(node.labels.get("ack.node.gpu.schedule", "") for node in fake.values())
    assert modes == ["", "cgpu", "cgpu", "cgpu", "core_mem", "default", "share", "topology"]
    assert fake["cgpu-spread-0"].labels["ack.node.gpu.placement"] == "spread"
    assert {
        node.labels.get("ack.node.gpu.placement") for node in fake.values() if node.name.startswith(("cgpu-binpack", "share"))
    } == {"binpack"}
    cards = {name: node.inventory["gpus"] for name, node in fake.items() if node.inventory is not None}
    # the 4 x 15 GiB cards of the seeds' binpack/spread pictures
    assert [card["memoryMiB"] for card in cards["cgpu-binpack-0"]] == [15360] * 4
    topology = fake["topology-0"].inventory
    assert len(cards["topology-0"]) == 8 and topology is not None and topology["topology"]["links"]
    assert {card["name"] for card in cards["exclusive-0"]} == {"Tesla M40"}
    assert fake["exclusive-0"].capacity == {"nvidia.com/gpu": "8"}  # a device plugin's, not the labeler's
    assert fake["cpu-0"].inventory is None and fake["cpu-0"].capacity == {}


def test_the_labeler_not_the_node_file_writes_card_labels_and_shared_capacity() -> None:
    for node in nodes.load(None):
        assert not any(key.startswith("aliyun.accelerator/") for key in node.labels), node.name
        assert not any(key.startswith("aliyun.com/") for key in node.capacity), node.name


def test_cards_in_a_node_file_become_its_inventory(tmp_path: Path) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text("nodes: [{name: a, gpus: [{index: 0, uuid: GPU-1, name: T4, memoryMiB: 15360}], topology: {links: []}}]")
    [node] = nodes.load(str(path))
    assert node.inventory == {
        "gpus": [{"index": 0, "uuid": "GPU-1", "name": "T4", "memoryMiB": 15360}],
        "topology": {"links": []},
    }


def test_a_node_manifest_carries_capacity_in_its_status_and_the_kwok_annotation() -> None:
    node = nodes.FakeNode(name="n1", labels={"a": "b"}, capacity={"nvidia.com/gpu": "2"})
    manifest = node.manifest()
    assert manifest["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
    assert manifest["metadata"]["labels"]["a"] == "b"
    assert manifest["status"]["capacity"]["nvidia.com/gpu"] == "2"
    assert manifest["status"]["allocatable"] == manifest["status"]["capacity"]
    assert manifest["status"]["capacity"]["pods"] == "110"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "expected a mapping with a 'nodes' list"),
        ("nodes: [{labels: {}}]", "nodes[0]: 'name' must be a non-empty string"),
        ("nodes: [{name: a, capacity: [1]}]", "nodes[0].capacity: expected a mapping"),
        ("nodes: [{name: a, labels: {x: {y: 1}}}]", "nodes[0].labels: 'x' must map to a string or number"),
        ("nodes: [{name: a}, {name: a}]", "duplicate node names: a"),
        ("nodes: [", "invalid YAML"),
        ("nodes: [{name: a, gpus: []}]", "nodes[0].gpus: expected a non-empty list of cards"),
        ("nodes: [{name: a, topology: {links: []}}]", "nodes[0]: 'topology' needs 'gpus'"),
        # the cards are the labeler's inventory file, read by the labeler's own parser
        (
            "nodes: [{name: a, gpus: [{index: 0, uuid: G, name: T4, memoryMiB: 0}]}]",
            "nodes[0]: gpus[0].memoryMiB: expected a positive integer (MiB), got 0",
        ),
        (
            "nodes: [{name: a, gpus: [{index: 0, uuid: G, name: T4, memoryMiB: 1}], topology: [[0, 1, NV2]]}]",
            "nodes[0]: link 0-1 names card 1, which is not in the inventory",
        ),
    ],
)
def test_a_bad_node_file_is_a_one_line_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text(text)
    with pytest.raises(nodes.NodeFileError) as caught:
        nodes.load(str(path))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_numbers_in_a_node_file_become_strings(tmp_path: Path) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text("nodes: [{name: a, capacity: {nvidia.com/gpu: 4}}]")
    [node] = nodes.load(str(path))
    assert node.capacity == {"nvidia.com/gpu": "4"}


def test_local_registrations_change_only_the_client_config() -> None:
    with open(install.deploy_dir() / install.WEBHOOK_CONFIGURATIONS, encoding="utf-8") as stream:
        documents = [d for d in yaml.safe_load_all(stream) if d]
    local = install.local_registrations(documents, base_url="https://127.0.0.1:8443", ca_bundle=b"PEM")
    assert [d["kind"] for d in local] == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    for original, changed in zip(documents, local, strict=True):
        for before, after in zip(original["webhooks"], changed["webhooks"], strict=True):
            assert after["clientConfig"] == {
                "url": "https://127.0.0.1:8443" + before["clientConfig"]["service"]["path"],
                "caBundle": base64.b64encode(b"PEM").decode(),
            }
            assert {k: v for k, v in after.items() if k != "clientConfig"} == {
                k: v for k, v in before.items() if k != "clientConfig"
            }
    assert "url" not in documents[0]["webhooks"][0]["clientConfig"]  # the source documents are not modified


def test_the_webhook_registrations_are_deliberate() -> None:
    with open(install.deploy_dir() / install.WEBHOOK_CONFIGURATIONS, encoding="utf-8") as stream:
        documents = [d for d in yaml.safe_load_all(stream) if d]
    hooks = [hook for document in documents for hook in document["webhooks"]]
    # The settings ConfigMap's check is the one exception, on purpose: it fails open (the webhook must
    # never block the repair of its own settings), writes nothing, and sees only its own namespace.
    [settings_hook] = [hook for hook in hooks if hook["name"] == "validate-settings.gpu-admission.io"]
    hooks.remove(settings_hook)
    assert (settings_hook["failurePolicy"], settings_hook["sideEffects"]) == ("Ignore", "None")
    assert settings_hook["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["gpu-admission"]}
    ]
    assert settings_hook["matchConditions"] == [
        {"name": "the-settings-configmap", "expression": "object.metadata.name == 'gpu-admission-policy'"}
    ]
    assert settings_hook["clientConfig"]["service"]["path"] == "/validate-settings"
    for hook in hooks:
        assert hook["admissionReviewVersions"] == ["v1"]
        # /validate records an Event on a denial (never on a dry run); /mutate never denies.
        assert hook["sideEffects"] == ("None" if hook["name"].startswith("mutate") else "NoneOnDryRun")
        assert hook["matchPolicy"] == "Equivalent"
        assert hook["failurePolicy"] == "Fail"
        assert 1 <= hook["timeoutSeconds"] <= 10
        [expression] = hook["namespaceSelector"]["matchExpressions"]
        assert expression == {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", "kube-node-lease", "gpu-admission"],
        }
    mutating = documents[0]["webhooks"][0]["rules"]
    assert {(tuple(r["operations"]), tuple(r["resources"])) for r in mutating} == {
        (("CREATE",), ("pods",)),
        (("UPDATE",), ("pods/ephemeralcontainers",)),
    }
    validated = {resource for rule in documents[1]["webhooks"][0]["rules"] for resource in rule["resources"]}
    assert validated == {
        "pods",
        "pods/ephemeralcontainers",
        "deployments",
        "statefulsets",
        "daemonsets",
        "replicasets",
        "replicationcontrollers",
        "jobs",
        "cronjobs",
    }
