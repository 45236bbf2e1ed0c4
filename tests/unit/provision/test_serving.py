"""Serving: a new pair goes into the live TLS context without a restart and never a broken one; a
draining server closes every connection after its answer and reports not ready; the certs CLI."""

from __future__ import annotations

import datetime
import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import test_utils
from cryptography import x509

from certs import rotation
from policies import settings
from tests.unit.provision.conftest import presented_certificate
from webhook import cli
from webhook.admission import app as admission_app
from webhook.admission import keys
from webhook.certificates import certfiles
from webhook.cmdline import errors
from webhook.serving import metrics, shell, tls

REPO = Path(__file__).resolve().parents[3]
NOW = datetime.datetime.now(datetime.UTC)


def leaf(directory: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate((directory / "tls.crt").read_bytes())


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    certfiles.generate(out_dir=tmp_path, hosts=("localhost",), now=NOW)
    return tmp_path


def watching(certs: Path) -> tuple[tls.FileWatch, metrics.Registry]:
    registry = metrics.Registry()
    watch = tls.FileWatch(
        tls.Serving(tls.new_server_context(), gauge=tls.expiry_gauge(registry)),
        cert_file=str(certs / "tls.crt"),
        key_file=str(certs / "tls.key"),
    )
    watch.start()
    return watch, registry


def test_rewritten_files_are_served_by_the_same_context_and_the_expiry_metric_follows(certs: Path) -> None:
    watch, registry = watching(certs)
    context = watch.serving.context
    assert presented_certificate(context) == leaf(certs)
    assert not watch.changed()
    certfiles.generate(out_dir=certs, hosts=("localhost",), now=NOW + datetime.timedelta(days=1))
    assert watch.changed()
    assert watch.reload(reason="test")
    assert watch.serving.context is context and presented_certificate(context) == leaf(certs)
    expiry = metrics.sample(registry.render(), tls.EXPIRY_METRIC, certificate="serving")
    assert expiry == leaf(certs).not_valid_after_utc.timestamp()
    assert "# TYPE gpu_admission_certificate_expiry_timestamp_seconds gauge" in registry.render()


def test_a_half_written_rotation_keeps_the_old_pair_and_is_retried_until_complete(
    certs: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    watch, _ = watching(certs)
    before = presented_certificate(watch.serving.context)
    fresh = tmp_path_factory.mktemp("fresh")
    certfiles.generate(out_dir=fresh, hosts=("localhost",), now=NOW)
    certfiles.write_atomically(certs / "tls.key", (fresh / "tls.key").read_bytes(), mode=0o600)  # key first, as generate writes
    assert watch.changed() and not watch.reload(reason="test")
    assert presented_certificate(watch.serving.context) == before, (
        "OpenSSL would have dropped the live key: the pair was tried aside first"
    )
    certfiles.write_atomically(certs / "tls.crt", (fresh / "tls.crt").read_bytes(), mode=0o644)
    assert watch.reload(reason="test") and presented_certificate(watch.serving.context) == leaf(fresh)


def test_an_expired_certificate_is_not_swapped_in_over_a_good_one(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    watch, _ = watching(certs)
    old = tmp_path_factory.mktemp("old")
    certfiles.generate(out_dir=old, hosts=("localhost",), now=NOW - datetime.timedelta(days=400))
    with pytest.raises(errors.InputError, match="expired"):
        watch.serving.offer(certificate_pem=(old / "tls.crt").read_bytes(), key_pem=(old / "tls.key").read_bytes(), source="old")
    assert presented_certificate(watch.serving.context) == leaf(certs)


def test_an_unchanged_pair_is_not_reloaded_unless_forced(certs: Path) -> None:
    watch, _ = watching(certs)
    assert not watch.reload(reason="test")
    assert watch.reload(reason="SIGHUP", force=True)


# --- draining -------------------------------------------------------------------------------------


async def test_a_draining_app_closes_each_connection_after_its_answer() -> None:
    app = admission_app.make_app(settings.Settings())
    draining = shell.install(app)
    async with test_utils.TestClient(test_utils.TestServer(app)) as client:
        answer = await client.get("/healthz")
        assert answer.status == 200 and answer.headers.get("Connection") != "close"
        draining.active = True
        answer = await client.get("/healthz")
        assert answer.headers["Connection"] == "close"
        missing = await client.get("/nowhere")
        assert missing.status == 404 and missing.headers["Connection"] == "close"
    assert app[keys.STATE] is not None


def test_sigterm_drains_ready_503_and_connection_close_then_stops_accepting_then_exits(certs: Path) -> None:
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
            str(certs / "tls.crt"),
            "--tls-private-key-file",
            str(certs / "tls.key"),
            "--drain-seconds",
            "2.5",
            "--drain-idle-seconds",
            "10",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline().strip().rsplit(":", 1)[1])
        context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        kept = http.client.HTTPSConnection("localhost", port, context=context, timeout=10)
        kept.request("GET", "/readyz")
        first = kept.getresponse()
        assert (first.status, first.getheader("Connection"), first.read()) == (200, None, b"ok\n")
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)

        def readyz() -> tuple[int, str | None]:
            connection = http.client.HTTPSConnection("localhost", port, context=context, timeout=10)
            try:
                connection.request("GET", "/readyz")
                answer = connection.getresponse()
                answer.read()
                return answer.status, answer.getheader("Connection")
            finally:
                connection.close()

        deadline = started + 2.0  # inside the drain window, with room for a busy machine
        while readyz() != (503, "close"):  # a new connection during the drain window
            assert time.monotonic() < deadline, "readyz did not turn 503 with Connection: close"
        kept.request("GET", "/healthz")  # the kept-alive connection: answered, then closed
        answer = kept.getresponse()
        assert (answer.status, answer.getheader("Connection")) == (200, "close")
        answer.read()
        kept.close()
        assert process.wait(timeout=20) == 0
        assert time.monotonic() - started >= 2.5, "the listener stayed open for the drain window"
        assert process.stderr is not None
        log = process.stderr.read()
        assert "listener closed; waiting up to 10s" in log and "closing" not in log.split("listener closed", 1)[1]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# --- CLI ------------------------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["serve", "--port", "0"], "either --tls-cert-file"),
        (
            ["serve", "--port", "0", "--self-managed-certs", "--tls-cert-file", "x", "--tls-private-key-file", "y"],
            "either --tls-cert-file",
        ),
        (["serve", "--port", "0", "--tls-cert-file", "x"], "go together"),
        (["serve", "--port", "0", "--self-managed-certs", "--renew-before", "400d"], "renew-before"),
    ],
)
def test_serve_certificate_modes_are_checked_in_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == "" and err.count("\n") == 1 and needle in err


def test_certs_rotate_ca_on_files_without_a_cluster_does_the_first_step_and_says_what_is_next(
    capsys: pytest.CaptureFixture[str], certs: Path
) -> None:
    old = rotation.parse({k: (certs / k).read_bytes() for k in rotation.KEYS})
    status, out, _ = run(capsys, "certs", "rotate", "--ca", "--out-dir", str(certs))
    assert status == 0 and "next: put" in out
    step1 = rotation.parse({k: (certs / k).read_bytes() for k in rotation.KEYS})
    assert step1.ca is not None and step1.trusted[1:] == old.trusted, "ca.crt: the new CA, then the old"
    assert (certs / "tls.crt").read_bytes() == old.files()["tls.crt"], "the serving pair waits for the bundle"
    status, out, _ = run(capsys, "certs", "rotate", "--out-dir", str(certs))
    assert status == 0
    step2 = rotation.parse({k: (certs / k).read_bytes() for k in rotation.KEYS})
    assert step2.serving is not None and rotation.signed_by(step2.serving.certificate, step1.ca.certificate)
    assert rotation.sans(step2.serving.certificate) == ("localhost",), "the SANs of the old certificate are kept"
    # generate still rotates the serving pair with the signing CA, also with two CAs in ca.crt
    certfiles.generate(out_dir=certs, hosts=("localhost",), now=NOW)
    again = rotation.parse({k: (certs / k).read_bytes() for k in rotation.KEYS})
    assert again.serving is not None and rotation.signed_by(again.serving.certificate, step1.ca.certificate)


def test_certs_show_on_files_lists_both_cas_and_the_serving_certificate(capsys: pytest.CaptureFixture[str], certs: Path) -> None:
    run(capsys, "certs", "rotate", "--ca", "--out-dir", str(certs))
    status, out, _ = run(capsys, "certs", "show", "--out-dir", str(certs), "-o", "json")
    assert status == 0
    report: dict[str, Any] = json.loads(out)
    assert [row["role"] for row in report["certificates"]] == ["ca", "ca (old)", "serving"]
    serving = report["certificates"][2]
    assert 364 < serving["daysLeft"] <= 365 and serving["trustedByClients"] is None
    status, out, _ = run(capsys, "certs", "show", "--out-dir", str(certs))
    assert status == 0 and out.count("expires") == 3


def test_certs_show_of_an_empty_directory_says_so_and_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, out, _ = run(capsys, "certs", "show", "--out-dir", str(tmp_path))
    assert status == 1 and "nothing stored" in out


def test_certs_show_output_file_writes_the_report_whole_and_prints_nothing(
    capsys: pytest.CaptureFixture[str], certs: Path, tmp_path: Path
) -> None:
    status, printed, _ = run(capsys, "certs", "show", "--out-dir", str(certs), "-o", "json")
    target = tmp_path / "certs.json"
    target.write_text("an older report\n")
    status_file, out, _ = run(capsys, "certs", "show", "--out-dir", str(certs), "-o", "json", "--output-file", str(target))
    assert status_file == status == 0 and out == ""

    def steady(text: str) -> Any:  # daysLeft moves with the clock between the two runs
        report = json.loads(text)
        for row in report["certificates"]:
            row["daysLeft"] = round(row["daysLeft"])
        return report

    written = target.read_text()
    assert written.endswith("}\n") and steady(written) == steady(printed), "the file holds what stdout would have shown"
    assert [row["role"] for row in steady(written)["certificates"]] == ["ca", "serving"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".certs.json.")] == [], "no temporary file left behind"
    status, out, err = run(capsys, "certs", "show", "--out-dir", str(certs), "--output-file", str(tmp_path / "missing" / "x.txt"))
    assert status != 0 and out == "" and "cannot write" in err


def test_certs_show_output_file_keeps_a_failing_report_and_its_exit_status(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    target = tmp_path / "report.txt"
    status, out, _ = run(capsys, "certs", "show", "--out-dir", str(empty), "--output-file", str(target))
    assert status == 1 and out == "" and "nothing stored" in target.read_text()
