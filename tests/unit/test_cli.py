"""The gpu-admission CLI: commands, dry-run output and exit codes, one-line errors, serve end to end."""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import pathlib
import signal
import ssl
import subprocess
import sys
import time
from typing import Any

import pytest
import yaml
from cryptography import x509

from webhook import cli

REPO = pathlib.Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "tests" / "data" / "manifests"
EXAMPLES = REPO / "examples"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    status, out, err = _run(capsys, *argv, "-o", "json")
    assert err == ""
    report: dict[str, Any] = json.loads(out)  # exactly one JSON document
    return status, report


def _assert_one_line_error(status: int, out: str, err: str, *needles: str) -> None:
    assert status == 2 and out == ""
    assert err.startswith("gpu-admission: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for command in ("serve", "dry-run", "certs", "cluster", "labeler"):
        assert command in out


def test_every_command_module_exposes_add_parser() -> None:
    assert all(callable(getattr(module, "add_parser", None)) for module in cli.commands())


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001 - argparse has no public accessor
    return list(action.choices)


def test_the_subcommand_map_names_what_each_module_registers() -> None:
    assert set(cli.SUBCOMMANDS.values()) == set(cli.MODULES)
    for module in cli.MODULES:
        registered = _subcommands(cli.make_parser((module,)))
        assert registered == [name for name, owner in cli.SUBCOMMANDS.items() if owner == module], module
    assert _subcommands(cli.make_parser()) == list(cli.SUBCOMMANDS)


def test_a_named_command_builds_a_parser_with_that_command_alone() -> None:
    assert _subcommands(cli._parser_for(["dry-run", "-f", "x"])) == ["dry-run"]  # noqa: SLF001
    assert _subcommands(cli._parser_for(["--help"])) == list(cli.SUBCOMMANDS)  # noqa: SLF001
    assert _subcommands(cli._parser_for(["no-such-command"])) == list(cli.SUBCOMMANDS)  # noqa: SLF001


def test_an_unknown_command_is_a_usage_error_listing_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["no-such-command"])
    assert exited.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_dry_run_of_allowed_workloads_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    status, report = _json(capsys, "dry-run", "-f", str(EXAMPLES / "workloads"))
    assert status == 0
    assert report["summary"]["denied"] == 0 and report["summary"]["objects"] == len(report["results"]) >= 5


def test_dry_run_of_each_bypass_exits_1_naming_its_policy(capsys: pytest.CaptureFixture[str]) -> None:
    bypasses = sorted((EXAMPLES / "bypasses").glob("gpu0*.yaml"))
    assert len(bypasses) >= 5, bypasses
    for path in bypasses:
        status, report = _json(capsys, "dry-run", "-f", str(path))
        policy = path.name[:6].upper()
        assert status == 1, path
        (result,) = report["results"]
        assert result["allowed"] is False
        assert policy in {v["policy"] for v in result["violations"] if v["action"] == "enforce"}
        assert result["patch"] == []


def test_json_report_shape_sources_and_patched_objects(capsys: pytest.CaptureFixture[str]) -> None:
    status, report = _json(capsys, "dry-run", "-f", str(MANIFESTS / "tree"))
    assert status == 1  # the List holds a bypass
    assert set(report) == {"results", "summary"}
    tree = MANIFESTS / "tree"
    assert [r["source"] for r in report["results"]] == [
        f"{tree}/multi.yaml#0",
        f"{tree}/multi.yaml#2",
        f"{tree}/nested/deeper/list.yml#0/items/0",
        f"{tree}/nested/deeper/list.yml#0/items/1",
        f"{tree}/nested/service.json#0",
    ]
    for result in report["results"]:
        assert set(result) == {
            "source",
            "apiVersion",
            "kind",
            "namespace",
            "name",
            "allowed",
            "violations",
            "patch",
            "patchAppliesTo",
            "object",
        }
    plain, shared, whole, sneaky, service = report["results"]
    assert (plain["namespace"], shared["namespace"], whole["namespace"]) == ("team-a", "default", "team-b")
    assert shared["patch"] == [{"op": "add", "path": "/spec/nodeSelector", "value": {"ack.node.gpu.schedule": "cgpu"}}]
    assert shared["object"]["spec"]["nodeSelector"] == {"ack.node.gpu.schedule": "cgpu"}
    assert shared["object"]["metadata"]["annotations"] == {"built": "2024-05-01"}  # a date stays a string
    assert sneaky["allowed"] is False and sneaky["violations"][0]["policy"] == "GPU001"
    assert service["allowed"] is True and service["patch"] == [] and service["violations"] == []
    assert report["summary"] == {"objects": 5, "denied": 1, "mutated": 1}


def test_stdin_is_read_for_dash(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    text = (EXAMPLES / "bypasses" / "gpu001-visible-devices-env.yaml").read_text()
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    status, report = _json(capsys, "dry-run", "-f", "-")
    assert status == 1 and report["results"][0]["source"] == "-#0"


def test_namespace_flag_applies_to_objects_without_one(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(EXAMPLES / "bypasses" / "gpu001-visible-devices-env.yaml")
    status, report = _json(capsys, "dry-run", "-f", path, "--namespace", "kube-system")
    assert status == 0 and report["results"][0]["namespace"] == "kube-system"


def test_config_changes_the_verdict(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text("policies:\n  GPU001: {action: warn}\n")
    path = str(EXAMPLES / "bypasses" / "gpu001-visible-devices-env.yaml")
    status, report = _json(capsys, "dry-run", "-f", path, "--config", str(config))
    assert status == 0 and report["results"][0]["violations"][0]["action"] == "warn"


def test_yaml_output_is_the_same_report(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(MANIFESTS / "tree")
    _, as_json = _json(capsys, "dry-run", "-f", path)
    status, out, _ = _run(capsys, "dry-run", "-f", path, "-o", "yaml")
    assert status == 1 and yaml.safe_load(out) == as_json


def test_table_shows_a_row_per_object_with_violations_and_patches(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _run(capsys, "dry-run", "-f", str(MANIFESTS / "tree"))
    assert status == 1
    lines = out.splitlines()
    assert lines[0].split() == ["SOURCE", "OBJECT", "NAMESPACE", "RESULT"]
    assert any("Pod/sneaky" in line and line.endswith("DENIED") for line in lines)
    assert any(line.strip().startswith("ENFORCE GPU001: ") for line in lines)
    assert any(line.strip() == 'PATCH   add /spec/nodeSelector = {"ack.node.gpu.schedule":"cgpu"}' for line in lines)
    assert lines[-1] == "5 object(s): 1 denied, 1 mutated"


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["-f", "does/not/exist.yaml"], ["does/not/exist.yaml", "no such file"]),
        (["-f", str(MANIFESTS / "bad" / "second-doc-broken.yaml")], ["second-doc-broken.yaml#1", "invalid YAML", "line"]),
        (["-f", str(MANIFESTS / "bad" / "scalar.yaml")], ["scalar.yaml#0", "not a Kubernetes object"]),
        (["-f", str(MANIFESTS / "bad" / "no-kind.yaml")], ["no-kind.yaml#0", "kind is missing"]),
        (["-f", str(MANIFESTS / "bad" / "broken.json")], ["broken.json#0", "invalid JSON"]),
        (
            ["-f", str(MANIFESTS / "tree"), "--config", str(MANIFESTS / "bad" / "config-bad-action.yaml")],
            ["config-bad-action.yaml", "GPU001"],
        ),
        (["-f", str(MANIFESTS / "tree"), "--config", "missing-config.yaml"], ["missing-config.yaml", "cannot read config"]),
    ],
)
def test_bad_input_is_one_line_naming_file_and_document_with_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], needles: list[str]
) -> None:
    _assert_one_line_error(*_run(capsys, "dry-run", *args), *needles)


def test_a_directory_without_manifests_is_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    (tmp_path / "notes.txt").write_text("nothing here")
    _assert_one_line_error(*_run(capsys, "dry-run", "-f", str(tmp_path)), str(tmp_path), "no .yaml/.yml/.json files")


def test_a_list_whose_items_are_not_a_list_is_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("apiVersion: v1\nkind: List\nitems: {a: 1}\n")
    _assert_one_line_error(*_run(capsys, "dry-run", "-f", str(path)), "list.yaml#0", "items must be a list")


def test_a_bad_list_item_names_its_position(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod}\n- 42\n")
    _assert_one_line_error(*_run(capsys, "dry-run", "-f", str(path)), "list.yaml#0/items/1")


def test_certs_generate_writes_the_files_for_every_host(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    status, out, _ = _run(capsys, "certs", "generate", "--out-dir", str(tmp_path), "--host", "svc.ns.svc", "--host", "10.0.0.1")
    assert status == 0 and sorted(pathlib.Path(line).name for line in out.splitlines()) == [
        "ca.crt",
        "ca.key",
        "tls.crt",
        "tls.key",
    ]
    leaf = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["svc.ns.svc"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.1"]


def test_certs_generate_with_a_bad_host_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    _assert_one_line_error(*_run(capsys, "certs", "generate", "--out-dir", str(tmp_path), "--host", "not a host"), "not a host")


def test_serve_with_a_missing_certificate_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    missing = str(tmp_path / "tls.crt")
    _assert_one_line_error(
        *_run(capsys, "serve", "--port", "0", "--tls-cert-file", missing, "--tls-private-key-file", missing), missing
    )


def test_serve_with_a_key_that_does_not_match_is_one_line(capsys: pytest.CaptureFixture[str], tls_dir: pathlib.Path) -> None:
    _assert_one_line_error(
        *_run(
            capsys,
            "serve",
            "--port",
            "0",
            "--tls-cert-file",
            str(tls_dir / "tls.crt"),
            "--tls-private-key-file",
            str(tls_dir / "ca.key"),
        ),
        "cannot load the TLS pair",
    )


def _wait_for_line(stream: Any, process: subprocess.Popen[str], needle: str, *, deadline_s: float = 20.0) -> str:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        line: str = stream.readline()
        if needle in line:
            return line
        if not line and process.poll() is not None:
            break
    raise AssertionError(f"no {needle!r} from the server before the deadline")


def test_serve_answers_over_tls_reloads_on_sighup_and_stops_on_sigterm(tmp_path: pathlib.Path) -> None:
    assert cli.main(["certs", "generate", "--out-dir", str(tmp_path), "--host", "127.0.0.1"]) == 0
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--tls-cert-file",
            str(tmp_path / "tls.crt"),
            "--tls-private-key-file",
            str(tmp_path / "tls.key"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        port = int(_wait_for_line(process.stdout, process, "listening on https://").rstrip().rsplit(":", 1)[1])
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))

        def serial() -> int:
            connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
            try:
                connection.request("GET", "/readyz")
                assert connection.getresponse().read() == b"ok\n"
                assert isinstance(connection.sock, ssl.SSLSocket)
                der = connection.sock.getpeercert(binary_form=True)
                assert der is not None
                return x509.load_der_x509_certificate(der).serial_number
            finally:
                connection.close()

        first = serial()
        assert cli.main(["certs", "generate", "--out-dir", str(tmp_path), "--host", "127.0.0.1"]) == 0
        process.send_signal(signal.SIGHUP)
        _wait_for_line(process.stderr, process, "SIGHUP: reloaded")
        assert serial() != first
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_export_vap_output_is_a_format_and_the_file_is_output_file(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    status, out, err = _run(capsys, "policies", "export-vap", "-o", "json")
    listed = json.loads(out)
    assert status == 0 and listed["kind"] == "List" and listed["apiVersion"] == "v1"
    assert {item["kind"] for item in listed["items"]} == {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    status, yaml_out, _ = _run(capsys, "policies", "export-vap")
    assert [d for d in yaml.safe_load_all(yaml_out) if d] == listed["items"]
    target = tmp_path / "vap.yaml"
    status, out, err = _run(capsys, "policies", "export-vap", "--output-file", str(target))
    assert status == 0 and out == "" and err == f"wrote {len(listed['items'])} manifests to {target}\n"
    assert target.read_text(encoding="utf-8") == yaml_out
    status, out, _ = _run(capsys, "policies", "export-vap", "-o", "json", "--output-file", str(target))
    assert status == 0 and out == "" and json.loads(target.read_text(encoding="utf-8")) == listed
    assert [p.name for p in tmp_path.iterdir()] == ["vap.yaml"]  # no temporary file left beside it


@pytest.mark.parametrize("old", ["vap.yaml", "out/vap.json", "-"])
def test_export_vap_refuses_the_old_o_file_spelling_naming_output_file(
    capsys: pytest.CaptureFixture[str], old: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        cli.main(["policies", "export-vap", "-o", old])
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == ""
    assert err.startswith("usage: gpu-admission policies export-vap ")
    assert err.splitlines()[-1] == (
        f"gpu-admission policies export-vap: error: argument -o/--output: {old!r} is not an output format (yaml|json): "
        f"-o names the format; to write to a file use --output-file {old}"
    )
    assert list(tmp_path.iterdir()) == []  # nothing written under the old meaning


def test_export_vap_refuses_an_unknown_format(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["policies", "export-vap", "-o", "csv"])
    assert exited.value.code == 2
    assert (
        capsys.readouterr().err.splitlines()[-1].endswith("argument -o/--output: invalid choice: 'csv' (choose from yaml, json)")
    )


def test_an_output_file_that_cannot_be_written_is_one_line_and_leaves_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    target = tmp_path / "missing" / "vap.yaml"
    _assert_one_line_error(*_run(capsys, "policies", "export-vap", "--output-file", str(target)), f"{target}: cannot write")
    assert list(tmp_path.iterdir()) == []


def test_an_output_file_is_replaced_whole(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    target = tmp_path / "report.json"
    target.write_text("x" * 1_000_000)  # longer than the report: a write in place would leave a tail
    inode = target.stat().st_ino
    status, out, _ = _run(capsys, "dry-run", "-f", str(MANIFESTS / "tree"), "-o", "json", "--output-file", str(target))
    assert status == 1 and out == ""
    assert json.loads(target.read_text(encoding="utf-8"))["summary"] == {"objects": 5, "denied": 1, "mutated": 1}
    assert target.stat().st_ino != inode  # a new file renamed over the old one, not the old one rewritten
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


@pytest.mark.parametrize(
    "argv",
    [
        ["dry-run", "-f", str(MANIFESTS / "tree")],
        ["policies", "list"],
        ["policies", "export-vap"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_output_file_holds_exactly_what_stdout_would(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, argv: list[str]
) -> None:
    status, printed, _ = _run(capsys, *argv, "-o", "yaml")
    target = tmp_path / "out.yaml"
    assert _run(capsys, *argv, "-o", "yaml", "--output-file", str(target))[:2] == (status, "")
    assert target.read_text(encoding="utf-8") == printed
    assert _run(capsys, *argv, "-o", "yaml", "--output-file", "-")[:2] == (status, printed)  # - is stdout


DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "shared", "namespace": "team-a"},
    "spec": {
        "selector": {"matchLabels": {"app": "shared"}},
        "template": {
            "metadata": {"labels": {"app": "shared"}},
            "spec": {"containers": [{"name": "m", "image": "i", "resources": {"limits": {"aliyun.com/gpu-mem": "4"}}}]},
        },
    },
}
SHARED_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "shared", "namespace": "team-a"},
    "spec": DEPLOYMENT["spec"]["template"]["spec"],  # type: ignore[index]
}


def test_dry_run_says_a_workloads_patch_lands_on_its_pods_not_on_the_stored_workload(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    manifest = tmp_path / "shared.yaml"
    manifest.write_text(yaml.safe_dump_all([DEPLOYMENT, SHARED_POD]))
    status, report = _json(capsys, "dry-run", "-f", str(manifest))
    deployment, pod = report["results"]
    assert status == 0 and deployment["patch"] and pod["patch"]
    assert deployment["patchAppliesTo"] == "pods created from this template"
    assert pod["patchAppliesTo"] == "this pod, as stored"
    status, out, _ = _run(capsys, "dry-run", "-f", str(manifest))
    notes = [line.strip() for line in out.splitlines() if line.strip().startswith("NOTE")]
    assert notes == ["NOTE    Deployment is stored unpatched; the patch applies to the pods created from its template"]
    status, out, _ = _run(capsys, "dry-run", "-f", str(manifest), "-o", "yaml")
    assert yaml.safe_load(out)["results"][0]["patchAppliesTo"] == "pods created from this template"


def test_dry_run_of_an_unmutated_kind_says_nothing_is_patched(capsys: pytest.CaptureFixture[str]) -> None:
    status, report = _json(capsys, "dry-run", "-f", str(MANIFESTS / "tree" / "nested" / "service.json"))
    (service,) = report["results"]
    assert service["patch"] == [] and service["patchAppliesTo"] == "nothing: this kind is not mutated"
    status, out, _ = _run(capsys, "dry-run", "-f", str(MANIFESTS / "tree"))
    assert not any(line.strip().startswith("NOTE") for line in out.splitlines())  # the mutated object there is a Pod


def test_serve_with_log_format_json_writes_one_json_object_per_line_with_the_review_uid(tmp_path: pathlib.Path) -> None:
    assert cli.main(["certs", "generate", "--out-dir", str(tmp_path), "--host", "127.0.0.1"]) == 0
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--log-format",
            "json",
            "--tls-cert-file",
            str(tmp_path / "tls.crt"),
            "--tls-private-key-file",
            str(tmp_path / "tls.key"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        port = int(_wait_for_line(process.stdout, process, "listening on https://").rstrip().rsplit(":", 1)[1])
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "json-log-uid-1",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "team-a",
                "operation": "CREATE",
                "userInfo": {"username": "alice"},
                "object": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "p"},
                    "spec": {"containers": [{"name": "m", "image": "i"}]},
                },
            },
        }
        connection = http.client.HTTPSConnection(
            "127.0.0.1", port, context=ssl.create_default_context(cafile=str(tmp_path / "ca.crt")), timeout=10
        )
        connection.request("POST", "/validate", body=json.dumps(review), headers={"Content-Type": "application/json"})
        assert json.loads(connection.getresponse().read())["response"]["uid"] == "json-log-uid-1"
        connection.close()
        line = _wait_for_line(process.stderr, process, "json-log-uid-1")
        logged = json.loads(line)
        assert logged["uid"] == "json-log-uid-1" and logged["endpoint"] == "validate" and logged["allowed"] == "True"
        assert logged["level"] == "info" and logged["logger"] == "webhook.admission.handlers" and "time" in logged
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        rest = process.stderr.read() if process.stderr is not None else ""
        for other in rest.splitlines():
            assert isinstance(json.loads(other), dict), other  # every line a JSON object, none plain text
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_policies_list_prints_the_same_rows_as_table_json_and_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    status, table, _ = _run(capsys, "policies", "list")
    assert status == 0
    status, out, _ = _run(capsys, "policies", "list", "-o", "json")
    listed = json.loads(out)
    assert status == 0 and listed[0]["id"] == "GPU001" and set(listed[0]) == {"id", "kind", "action", "source", "summary"}
    assert [row.split()[0] for row in table.splitlines()[1:]] == [item["id"] for item in listed]
    status, out, _ = _run(capsys, "policies", "list", "-o", "yaml")
    assert yaml.safe_load(out) == listed
