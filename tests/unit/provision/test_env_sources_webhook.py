"""The GPU007 webhook entry: what the apiserver sends (match condition), and what the webhook answers.

The match condition is CEL that kube-apiserver evaluates before calling us; it is run here with the
same CEL runtime the user policies use, as the apiserver hands objects to it (absent fields absent).
"""

from __future__ import annotations

import base64
import json
import logging
import pathlib
import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from policies import cel, gpu, settings
from webhook.admission import app as admission_app

DEPLOY = pathlib.Path(__file__).parents[3] / "deploy"
NAME = "validate-env-sources.gpu-admission.io"


def configurations() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / "webhook-configurations.yaml").read_text()) if d]


def entry() -> dict[str, Any]:
    found: dict[str, Any]
    (found,) = [h for c in configurations() for h in c["webhooks"] if h["name"] == NAME]
    return found


def sent(obj: dict[str, Any]) -> bool:
    """Whether kube-apiserver would call the webhook for `obj` (every match condition true)."""
    env = cel.environment()
    activation = {"object": obj, "oldObject": None, "request": {"operation": "CREATE"}}
    return all(
        cel.evaluate(cel.compile_expression(env, c["expression"], field=c["name"]), activation) is True
        for c in entry()["matchConditions"]
    )


def test_the_match_condition_lists_exactly_the_guarded_names() -> None:
    (condition,) = entry()["matchConditions"]
    listed = re.search(r"\[([^\]]*)\]\.exists", condition["expression"])
    assert listed is not None
    assert set(re.findall(r"'([^']*)'", listed.group(1))) == gpu.GUARDED_ENV


def test_it_is_a_separate_validating_entry_for_config_maps_and_secrets_that_fails_closed() -> None:
    hook = entry()
    (configuration,) = [c for c in configurations() if hook in c["webhooks"]]
    assert configuration["kind"] == "ValidatingWebhookConfiguration"
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["configmaps", "secrets"],
            "scope": "Namespaced",
        }
    ]
    assert (hook["failurePolicy"], hook["sideEffects"], hook["clientConfig"]["service"]["path"]) == (
        "Fail",
        "NoneOnDryRun",
        "/validate",
    )
    pods = next(h for h in configuration["webhooks"] if h["name"] == "validate.gpu-admission.io")
    assert hook["namespaceSelector"] == pods["namespaceSelector"]
    assert hook["clientConfig"]["service"] == pods["clientConfig"]["service"]


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    "obj",
    [
        {"kind": "ConfigMap", "data": {"NVIDIA_VISIBLE_DEVICES": "all"}},
        {"kind": "ConfigMap", "data": {"A": "1", "CGPU_DISABLE": "true"}},
        {"kind": "ConfigMap", "binaryData": {"ALIYUN_COM_GPU_MEM_CONTAINER": b64("15")}},
        {"kind": "Secret", "data": {"NVIDIA_VISIBLE_DEVICES": b64("void")}},
        {"kind": "Secret", "stringData": {"ALIYUN_COM_GPU_VISIBLE_DEVICES": "0,1"}},
    ],
)
def test_sources_carrying_a_guarded_key_are_sent(obj: dict[str, Any]) -> None:
    assert sent(obj)


@pytest.mark.parametrize(
    "obj",
    [
        {"kind": "ConfigMap", "data": {"LOG_LEVEL": "debug", "config.yaml": "NVIDIA_VISIBLE_DEVICES: all"}},
        {"kind": "ConfigMap"},
        {"kind": "ConfigMap", "data": {"nvidia_visible_devices": "all", "VISIBLE_DEVICES": "all"}},
        {"kind": "Secret", "type": "kubernetes.io/tls", "data": {"tls.crt": b64("x"), "tls.key": b64("y")}},
        {"kind": "Secret", "data": {"password": b64("NVIDIA_VISIBLE_DEVICES")}},
    ],
)
def test_ordinary_sources_are_never_sent(obj: dict[str, Any]) -> None:
    assert not sent(obj)


def review(obj: dict[str, Any], *, operation: str = "CREATE") -> dict[str, Any]:
    kind = obj["kind"]
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-7",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
            "name": obj["metadata"]["name"],
            "namespace": "team-a",
            "operation": operation,
            "userInfo": {"username": "tenant"},
            "object": obj,
        },
    }


async def test_the_webhook_refuses_a_secret_with_the_key_and_never_shows_its_values(
    aiohttp_client: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    value = "very-secret-value"
    obj = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "creds", "namespace": "team-a"},
        "data": {"CGPU_DISABLE": b64(value), "TOKEN": b64(value)},
    }
    client = await aiohttp_client(admission_app.make_app(settings.Settings()))

    answer = await client.post("/validate", json=review(obj))
    text = await answer.text()

    assert answer.status == 200
    body = await answer.json()
    assert body["response"]["allowed"] is False
    assert body["response"]["status"]["message"].startswith("GPU007: ")
    assert "Secret 'creds' has the key CGPU_DISABLE;" in body["response"]["status"]["message"]
    for shown in (value, b64(value)):
        assert shown not in text
        assert shown not in caplog.text


async def test_the_webhook_admits_an_update_that_removes_the_key(aiohttp_client: Callable[..., Any]) -> None:
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app", "namespace": "team-a"}, "data": {"LEVEL": "1"}}
    client = await aiohttp_client(admission_app.make_app(settings.Settings()))

    body = await (await client.post("/validate", json=review(obj, operation="UPDATE"))).json()

    assert body["response"]["allowed"] is True


# --- dry-run: the same verdict offline, and the report never echoes a Secret value -----------------

SOURCES = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: gpus, namespace: team-a}
data: {NVIDIA_VISIBLE_DEVICES: all}
---
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: team-a}
stringData: {CGPU_DISABLE: "true", password: hunter2-value}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: plain, namespace: team-a}
data: {LOG_LEVEL: debug}
"""


@pytest.mark.parametrize("output", ["json", "yaml", "table"])
def test_dry_run_denies_sources_with_guarded_keys_and_redacts_secret_values(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], output: str
) -> None:
    from webhook import cli  # noqa: PLC0415 - the CLI imports much; only these tests need it

    manifest = tmp_path / "sources.yaml"
    manifest.write_text(SOURCES)

    status = cli.main(["dry-run", "-f", str(manifest), "-o", output])
    printed = capsys.readouterr().out

    assert status == 1
    assert "hunter2" not in printed
    if output == "table":
        assert printed.count("DENIED") == 2 and "ConfigMap/plain" in printed
        return
    report = json.loads(printed) if output == "json" else yaml.safe_load(printed)
    verdicts = {r["name"]: (r["allowed"], [v["policy"] for v in r["violations"]]) for r in report["results"]}
    assert verdicts == {"gpus": (False, ["GPU007"]), "creds": (False, ["GPU007"]), "plain": (True, [])}
    creds = next(r for r in report["results"] if r["name"] == "creds")
    assert creds["object"]["stringData"] == {"CGPU_DISABLE": "(redacted)", "password": "(redacted)"}
