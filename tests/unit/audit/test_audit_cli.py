"""`gpu-admission audit` from the command line: -f mode, output formats and files, exit codes 0/1/2."""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from webhook.audit import cli

SNAPSHOT = pathlib.Path(__file__).parent / "data" / "cluster.yaml"
CLEAN_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "clean", "namespace": "ml"},
    "spec": {
        "nodeSelector": {"ack.node.gpu.schedule": "cgpu"},
        "containers": [{"name": "m", "image": "i", "resources": {"limits": {"aliyun.com/gpu-mem": 3}}}],
    },
}


def test_findings_at_enforce_level_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-f", str(SNAPSHOT)]) == 1
    out = capsys.readouterr().out
    assert "GPU202" in out and out.rstrip().endswith("8 at enforce level")


def test_a_clean_audit_exits_0_even_with_warnings(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    warned = dict(CLEAN_POD, metadata={"name": "loose", "namespace": "ml"}, spec={"containers": CLEAN_POD["spec"]["containers"]})  # type: ignore[index]
    manifest = tmp_path / "pods.yaml"
    manifest.write_text(yaml.safe_dump_all([CLEAN_POD, warned]))
    assert cli.main(["-f", str(manifest)]) == 0
    assert "GPU207  warn    warn" in capsys.readouterr().out  # a warn-level failure is reported as warn, as Kyverno does


def test_only_what_is_set_to_enforce_fails_the_audit(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "sneaky.yaml"
    sneaky = dict(CLEAN_POD)
    sneaky["spec"] = {"containers": [{"name": "m", "image": "i", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}
    manifest.write_text(yaml.safe_dump(sneaky))
    settings = tmp_path / "settings.yaml"
    settings.write_text("policies:\n  GPU001: {action: audit}\n")
    assert cli.main(["-f", str(manifest)]) == 1
    assert cli.main(["-f", str(manifest), "--config", str(settings)]) == 0
    assert "GPU001  fail    audit" in capsys.readouterr().out


def test_json_output_is_a_list_of_policy_reports(capsys: pytest.CaptureFixture[str]) -> None:
    cli.main(["-f", str(SNAPSHOT), "-o", "json"])
    listed = json.loads(capsys.readouterr().out)
    assert listed["kind"] == "List"
    kinds = {(item["kind"], item["metadata"].get("namespace", "")) for item in listed["items"]}
    assert kinds == {
        ("PolicyReport", "kube-system"),
        ("PolicyReport", "ml"),
        ("PolicyReport", "ops"),
        ("ClusterPolicyReport", ""),
    }
    assert all(r["result"] != "pass" for item in listed["items"] for r in item["results"])


def test_yaml_output_with_all_results_stores_passes(capsys: pytest.CaptureFixture[str]) -> None:
    cli.main(["-f", str(SNAPSHOT), "-o", "yaml", "--all-results"])
    listed = yaml.safe_load(capsys.readouterr().out)
    passes = sum(item["summary"]["pass"] for item in listed["items"])
    assert passes == 134  # GPU011 and GPU012 pass on each of the 9 pods and workloads; GPU217 on the 3 labelled GPU nodes


def test_a_namespace_filter_in_file_mode(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-f", str(SNAPSHOT), "-n", "ops", "-o", "json"]) == 1
    listed = json.loads(capsys.readouterr().out)
    assert [item["metadata"]["namespace"] for item in listed["items"]] == ["ops"]


@pytest.mark.parametrize(
    ("output", "marker"), [("html", "<!DOCTYPE html>"), ("markdown", "## gpu-admission audit"), ("table", "NAMESPACE")]
)
def test_output_file_gets_the_rendering_and_stdout_stays_empty(
    output: str, marker: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / f"audit.{output}"
    assert cli.main(["-f", str(SNAPSHOT), "-o", output, "--output-file", str(target)]) == 1
    assert target.read_text().startswith(marker)
    assert capsys.readouterr().out == ""
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no temporary file left behind


def test_stdin_is_read_with_a_dash(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(CLEAN_POD)))
    assert cli.main(["-f", "-"]) == 0
    assert "1 object(s) audited" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-f", "/nonexistent/x.yaml"], "/nonexistent/x.yaml: no such file or directory"),
        (["-f", str(SNAPSHOT), "--write-reports"], "--write-reports needs a cluster; it cannot be combined with -f"),
        (["-f", str(SNAPSHOT), "--config", "/nonexistent/settings.yaml"], "/nonexistent/settings.yaml: cannot read config"),
        (["-f", str(SNAPSHOT), "--output-file", "/nonexistent/dir/out.html"], "/nonexistent/dir/out.html: cannot write"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "cannot load /nonexistent/kubeconfig"),
    ],
)
def test_errors_are_one_line_with_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith("gpu-admission: error: ") and message in line
    assert "Traceback" not in captured.err


def test_an_unreachable_apiserver_is_one_line_with_exit_2(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        )
    )
    assert cli.main(["--kubeconfig", str(kubeconfig)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("gpu-admission: error: cannot list Node objects in the cluster: ")


def test_namespace_and_all_namespaces_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["-n", "a", "-A"])
    assert exited.value.code == 2


def test_report_scope_resource_prints_one_scoped_report_per_object(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-f", str(SNAPSHOT), "-o", "json"]) == 1
    by_namespace = json.loads(capsys.readouterr().out)["items"]
    assert cli.main(["-f", str(SNAPSHOT), "-o", "json", "--report-scope", "resource"]) == 1
    by_resource = json.loads(capsys.readouterr().out)["items"]
    assert all("scope" not in item and item["metadata"]["name"] == "gpu-admission" for item in by_namespace)
    assert len(by_resource) > len(by_namespace)
    for item in by_resource:
        scope = item["scope"]
        assert item["metadata"]["labels"]["gpu-admission.io/report-scope"] == "resource"
        assert all(r["resources"][0]["name"] == scope["name"] for r in item["results"])
        assert item["kind"] == ("PolicyReport" if scope.get("namespace") else "ClusterPolicyReport")

    # the same results, regrouped (the two runs' timestamps differ)
    def bare(items: list[dict[str, object]]) -> list[str]:
        return sorted(
            json.dumps({k: v for k, v in r.items() if k != "timestamp"}, sort_keys=True)
            for item in items
            for r in item["results"]  # type: ignore[attr-defined]
        )

    assert bare(by_resource) == bare(by_namespace)
