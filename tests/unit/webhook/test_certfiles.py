"""certs generate writes the four files with safe modes, and a second run rotates only the leaf."""

from __future__ import annotations

import datetime
import os
import pathlib
import stat

import pytest
from cryptography import x509

from webhook.certificates import certfiles
from webhook.cmdline import errors

NOW = datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC)


def _mode(path: pathlib.Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_generate_writes_ca_and_serving_pair_with_private_keys_0600(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "new" / "dir"
    written = certfiles.generate(out_dir=out, hosts=("webhook.ns.svc",), now=NOW)
    assert sorted(p.name for p in written) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    assert _mode(out / "tls.key") == _mode(out / "ca.key") == 0o600
    assert _mode(out / "tls.crt") == _mode(out / "ca.crt") == 0o644


def test_a_second_run_keeps_the_ca_and_replaces_the_serving_pair(tmp_path: pathlib.Path) -> None:
    certfiles.generate(out_dir=tmp_path, hosts=("webhook.ns.svc",), now=NOW)
    ca_before = (tmp_path / "ca.crt").read_bytes()
    leaf_before = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    written = certfiles.generate(out_dir=tmp_path, hosts=("webhook.ns.svc", "10.1.2.3"), now=NOW + datetime.timedelta(days=200))
    assert sorted(p.name for p in written) == ["tls.crt", "tls.key"]
    assert (tmp_path / "ca.crt").read_bytes() == ca_before
    leaf_after = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    assert leaf_after.serial_number != leaf_before.serial_number
    assert leaf_after.issuer == x509.load_pem_x509_certificate(ca_before).subject


def test_half_a_kept_ca_is_an_input_error(tmp_path: pathlib.Path) -> None:
    certfiles.generate(out_dir=tmp_path, hosts=("localhost",), now=NOW)
    (tmp_path / "ca.key").unlink()
    with pytest.raises(errors.InputError, match="ca.key: missing"):
        certfiles.generate(out_dir=tmp_path, hosts=("localhost",), now=NOW)


def test_an_unwritable_directory_is_an_input_error(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(errors.InputError, match="file"):
        certfiles.generate(out_dir=blocker / "sub", hosts=("localhost",), now=NOW)


def test_an_interrupted_write_leaves_no_temporary_file(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)  # the os module certfiles uses
    with pytest.raises(OSError):
        certfiles.write_atomically(tmp_path / "tls.key", b"secret", mode=0o600)
    assert list(tmp_path.iterdir()) == []
