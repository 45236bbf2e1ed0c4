"""Exceptions must be anchored to namespaces: a pod's author must not be able to label a pod into one.

`names` and `objectSelector` are written by whoever writes the pod; namespace names and namespace
labels are not (tenants cannot label namespaces). Every way settings are loaded refuses an
unanchored exception with one line that names it.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import yaml

from policies import engine, model, settings
from tests.conftest import PodFactory
from webhook import cli
from webhook.admission import configwatch, keys
from webhook.serving import metrics

UNANCHORED = [
    pytest.param({"names": ["dcgm-exporter-*"]}, id="names-only"),
    pytest.param({"objectSelector": {"matchLabels": {"app": "dcgm-exporter"}}}, id="object-selector-only"),
    pytest.param({"names": ["x"], "objectSelector": {"matchLabels": {"app": "x"}}}, id="names-and-object-selector"),
    pytest.param({"namespaceSelector": {}}, id="empty-namespace-selector"),
    pytest.param(
        {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}]}}, id="notin-only"
    ),
    pytest.param(
        {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}}, id="doesnotexist-only"
    ),
    pytest.param(
        {"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "Exists"}]}},
        id="exists-on-the-name-every-namespace-has",
    ),
]

ANCHORED = [
    pytest.param({"namespaces": ["monitoring"]}, id="namespaces"),
    pytest.param(
        {"namespaces": ["monitoring"], "objectSelector": {"matchLabels": {"app": "dcgm-exporter"}}}, id="namespaces-narrowed"
    ),
    pytest.param({"namespaceSelector": {"matchLabels": {"team": "ops"}}}, id="match-labels"),
    pytest.param({"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["ops"]}]}}, id="in"),
    pytest.param({"namespaceSelector": {"matchExpressions": [{"key": "ops", "operator": "Exists"}]}}, id="exists"),
    pytest.param(
        {
            "namespaceSelector": {
                "matchLabels": {"team": "ops"},
                "matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["prod"]}],
            }
        },
        id="match-labels-and-notin",
    ),
]


def document(match: dict[str, Any], *, name: str = "dcgm") -> dict[str, Any]:
    return {"exceptions": [{"name": name, "policies": ["GPU002"], "match": match}]}


@pytest.mark.parametrize("match", UNANCHORED)
def test_an_exception_not_anchored_to_namespaces_is_refused_naming_it(match: dict[str, Any]) -> None:
    with pytest.raises(settings.InvalidSettings) as raised:
        settings.from_mapping(document(match, name="dcgm"))

    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("exceptions[0].match: exception 'dcgm' is not anchored to namespaces")
    assert "match.namespaces" in message and "namespaceSelector" in message


@pytest.mark.parametrize("match", ANCHORED)
def test_an_exception_anchored_by_namespace_names_or_labels_is_accepted(match: dict[str, Any]) -> None:
    loaded = settings.from_mapping(document(match))

    (exception,) = loaded.exceptions
    assert exception.name == "dcgm" and exception.namespaces is not None


def test_the_second_exception_is_named_when_only_it_is_unanchored() -> None:
    data = {
        "exceptions": [
            {"name": "ok", "policies": ["GPU002"], "match": {"namespaces": ["monitoring"]}},
            {"name": "by-label", "policies": ["GPU003"], "match": {"objectSelector": {"matchLabels": {"a": "b"}}}},
        ]
    }
    with pytest.raises(settings.InvalidSettings, match=r"^exceptions\[1\]\.match: exception 'by-label' is not anchored"):
        settings.from_mapping(data)


def test_a_tenant_labelling_its_pod_like_the_exempted_one_is_still_judged(make_pod: PodFactory) -> None:
    loaded = settings.from_mapping(
        document({"namespaces": ["monitoring"], "objectSelector": {"matchLabels": {"app": "dcgm-exporter"}}})
    )

    def judged(namespace: str) -> model.Decision:
        pod = make_pod(name="dcgm-exporter-1", namespace=namespace, limits={"nvidia.com/gpu": 1}, privileged=True)
        pod["metadata"]["labels"] = {"app": "dcgm-exporter"}
        return engine.evaluate(model.Request(operation="CREATE", object=pod, namespace=namespace), settings=loaded)

    in_monitoring = judged("monitoring")
    in_tenant = judged("team-a")

    assert in_monitoring.allowed
    assert {r.policy: r.message for r in in_monitoring.results}["GPU002"] == "exception dcgm"
    assert not in_tenant.allowed
    assert [v.policy for v in in_tenant.violations] == ["GPU002"]


UNANCHORED_YAML = "exceptions: [{name: by-label, policies: [GPU002], match: {objectSelector: {matchLabels: {app: x}}}}]\n"


def _run_with_unanchored_exception(
    command: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], make_pod: PodFactory
) -> tuple[int, str, str, pathlib.Path]:
    """`gpu-admission COMMAND -f pod.yaml --config config.yaml` with the unanchored exception in config.yaml:
    the exit status, stdout, stderr and the settings file's path."""
    config = tmp_path / "config.yaml"
    config.write_text(UNANCHORED_YAML)
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump(make_pod()))
    status = cli.main([command, "-f", str(manifest), "--config", str(config)])
    out, err = capsys.readouterr()
    return status, out, err, config


def test_dry_run_exits_2_with_one_line_on_an_unanchored_exception(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], make_pod: PodFactory
) -> None:
    status, out, err, config = _run_with_unanchored_exception("dry-run", tmp_path, capsys, make_pod)

    assert status == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{config}: exceptions[0].match: exception 'by-label' is not anchored to namespaces" in err


def test_audit_exits_2_with_one_line_on_an_unanchored_exception(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], make_pod: PodFactory
) -> None:
    status, out, err, _ = _run_with_unanchored_exception("audit", tmp_path, capsys, make_pod)

    assert status == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "exception 'by-label' is not anchored to namespaces" in err


def test_serve_refuses_to_start_on_an_unanchored_exception(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], tls_dir: pathlib.Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(UNANCHORED_YAML)

    status = cli.main(
        [
            "serve",
            "--port",
            "0",
            "--host",
            "127.0.0.1",
            "--config",
            str(config),
            "--tls-cert-file",
            str(tls_dir / "tls.crt"),
            "--tls-private-key-file",
            str(tls_dir / "tls.key"),
        ]
    )

    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and "exception 'by-label' is not anchored to namespaces" in err


async def test_a_reload_to_an_unanchored_exception_keeps_the_last_good_settings(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("exceptions: [{name: ops, policies: [GPU002], match: {namespaces: [monitoring]}}]\n")
    source = configwatch.Source(config_path=str(config))
    watch = configwatch.Watcher(
        source=source,
        live=keys.LiveSettings(current=configwatch.load(source)),
        meters=configwatch.register(metrics.Registry()),
        seen=configwatch.fingerprint(source),
        clock=lambda: 1000.0,
    )
    before = watch.live.current

    config.write_text(UNANCHORED_YAML)

    assert await watch.check() is False
    assert watch.live.current is before
    assert [e.name for e in watch.live.current.exceptions] == ["ops"]
    assert watch.meters.errors.value() == 1.0
