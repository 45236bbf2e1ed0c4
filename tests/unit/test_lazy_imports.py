"""The heavy libraries load when first used, not when a command starts.

The kubernetes client (about 17 MiB resident) and cel-expr-python (about 14 MiB) are imported only
by the code that talks to a cluster or compiles a user policy; ``serve`` from certificate files,
``dry-run`` without user policies and every worker forked from them never pay for either.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

from webhook.kube import lazy

HEAVY = ("kubernetes", "cel_expr_python", "urllib3")


def _loaded_after(code: str) -> dict[str, bool]:
    """Which of HEAVY a fresh interpreter holds after running ``code``."""
    script = textwrap.dedent(code) + textwrap.dedent(
        f"""
        import json, sys
        print(json.dumps({{name: name in sys.modules for name in {HEAVY!r}}}))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    loaded: dict[str, bool] = json.loads(done.stdout.splitlines()[-1])
    return loaded


@pytest.mark.parametrize("module", ["webhook.cli", "webhook.commands.serve", "webhook.commands.dryrun", "webhook.extender.app"])
def test_starting_a_command_imports_neither_the_kubernetes_client_nor_cel(module: str) -> None:
    assert _loaded_after(f"import {module}") == dict.fromkeys(HEAVY, False)


def test_a_dry_run_without_user_policies_imports_neither(tmp_path: pathlib.Path) -> None:
    manifest = tmp_path / "pod.json"
    manifest.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p", "namespace": "team-a"},
                "spec": {"containers": [{"name": "c", "image": "cuda", "resources": {"limits": {"aliyun.com/gpu-mem": 4}}}]},
            }
        )
    )
    loaded = _loaded_after(
        f"""
        import contextlib, io
        from webhook import cli
        with contextlib.redirect_stdout(io.StringIO()) as out:
            status = cli.main(["dry-run", "-f", {str(manifest)!r}, "-o", "json"])
        assert status == 0, (status, out.getvalue())
        import json
        result = json.loads(out.getvalue())["results"][0]
        assert result["allowed"] and result["patch"][0]["path"] == "/spec/nodeSelector", result
        """
    )
    assert loaded == dict.fromkeys(HEAVY, False)


def test_compiling_a_user_policy_imports_cel_and_only_it() -> None:
    loaded = _loaded_after(
        """
        from policies import cel
        env = cel.environment()
        cel.compile_expression(env, "object.metadata.name != ''", field="validations[0].expression")
        """
    )
    assert loaded == {"kubernetes": False, "cel_expr_python": True, "urllib3": False}


def test_making_an_api_client_imports_kubernetes() -> None:
    loaded = _loaded_after(
        """
        from webhook import kube
        try:
            kube.api_client("/nonexistent/kubeconfig")
        except kube.ConfigError:
            pass
        """
    )
    assert loaded["kubernetes"] is True


def test_module_imports_on_first_attribute_and_then_reuses_it() -> None:
    stand_in = lazy.Module("json")
    assert "not imported yet" in repr(stand_in)
    assert stand_in.dumps({"a": 1}) == json.dumps({"a": 1})
    assert "imported" in repr(stand_in) and "not" not in repr(stand_in)
    assert stand_in.loads is json.loads


def test_module_reports_a_missing_attribute_as_attribute_error() -> None:
    with pytest.raises(AttributeError):
        _ = lazy.Module("json").no_such_function


def test_module_reports_a_missing_module_on_first_use() -> None:
    missing = lazy.Module("no_such_module_anywhere")
    with pytest.raises(ModuleNotFoundError):
        _ = missing.anything
