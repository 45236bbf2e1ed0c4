"""``serve --workers N`` with cluster access imports the kubernetes client before it forks.

Each worker reaches the cluster (namespace labels, lookups, events) through the kubernetes client,
which ``webhook.kube.lazy`` imports on first use: after the fork, that was one private copy of the
client and its models per worker (two idle workers and the supervisor: 129 MiB of PSS against 92; bench/README.md). Imported in the
``serve`` process before the fork, the workers share one copy. Without cluster access nothing
is imported, as before. Each case runs in a fresh interpreter, where nothing has imported the
client yet.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
users: [{name: u, user: {token: t}}]
"""


def _run(code: str) -> dict[str, bool]:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, check=True)
    loaded: dict[str, bool] = json.loads(done.stdout.splitlines()[-1])
    return loaded


def _at_fork(tmp_path: pathlib.Path, *flags: str) -> dict[str, bool]:
    """What the ``serve`` process holds when it would fork its workers (``workers.supervise``
    replaced by a probe that records it)."""
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    return _run(
        f"""
        import contextlib, io, json, sys
        from webhook import cli
        from webhook.serving import workers
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli.main(["certs", "generate", "--out-dir", {str(tmp_path)!r}, "--host", "127.0.0.1"]) == 0
        seen = {{}}
        def probe(args, **_):
            seen.update({{
                "client": "kubernetes.client.api.core_v1_api" in sys.modules,
                "models": "kubernetes.client.models.v1_namespace_list" in sys.modules,
            }})
            return 0
        workers.supervise = probe
        status = cli.main(["serve", "--port", "0", "--workers", "2", "--tls-cert-file", {str(tmp_path / "tls.crt")!r},
                           "--tls-private-key-file", {str(tmp_path / "tls.key")!r}, *{list(flags)!r}])
        assert status == 0 and seen, (status, seen)
        print(json.dumps(seen))
        """
    )


def test_with_cluster_access_the_client_and_its_models_are_imported_before_the_fork(tmp_path: pathlib.Path) -> None:
    assert _at_fork(tmp_path, "--kubeconfig", str(tmp_path / "kubeconfig")) == {"client": True, "models": True}


def test_without_cluster_access_nothing_of_the_client_is_imported(tmp_path: pathlib.Path) -> None:
    assert _at_fork(tmp_path) == {"client": False, "models": False}
