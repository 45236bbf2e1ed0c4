"""``gpu-admission certs generate``: issue the CA and serving pair and write them as files.

Files in ``--out-dir``: ``ca.crt`` (the webhook configurations' caBundle), ``ca.key`` (kept, mode
0600, so the serving certificate can be rotated without touching any caBundle), ``tls.crt`` and
``tls.key`` (mode 0600). When ``ca.crt`` and ``ca.key`` already exist there, they are reused and
only the serving pair is replaced: that is the rotation path (then SIGHUP the server).
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import tempfile

from certs import authority
from webhook import errors

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
PUBLIC_MODE = 0o644
SECRET_MODE = 0o600


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("certs", help="certificates for the webhook", description="Certificate tools.")
    actions = parser.add_subparsers(dest="certs_command", required=True, metavar="ACTION")
    generate = actions.add_parser(
        "generate",
        help="write ca.crt, ca.key, tls.crt, tls.key (ECDSA P-256; CA 10 years, serving 1 year)",
        description="Issue a serving certificate for every --host (DNS name or IP address). An existing "
        "ca.crt + ca.key in --out-dir is reused, so running this again rotates only tls.crt/tls.key.",
    )
    generate.add_argument("--out-dir", required=True, metavar="DIR", help="directory for the files (created)")
    generate.add_argument(
        "--host",
        action="append",
        required=True,
        metavar="NAME",
        help="DNS name or IP for the SANs, repeatable (e.g. gpu-admission.gpu-admission.svc)",
    )
    generate.set_defaults(func=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    out_dir = pathlib.Path(args.out_dir)
    written = generate(out_dir=out_dir, hosts=tuple(args.host), now=datetime.datetime.now(datetime.UTC))
    for path in written:
        print(path)
    return 0


def generate(*, out_dir: pathlib.Path, hosts: tuple[str, ...], now: datetime.datetime) -> list[pathlib.Path]:
    """Issue (or rotate) the serving pair in ``out_dir``; return the paths written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        kept = _kept_ca(out_dir)
        bundle = authority.issue_bundle(hosts=hosts, now=now, ca=kept)
        files = [(TLS_KEY, bundle.serving.key_pem, SECRET_MODE), (TLS_CERT, bundle.serving.certificate_pem, PUBLIC_MODE)]
        if kept is None:
            files = [(CA_KEY, bundle.ca.key_pem, SECRET_MODE), (CA_CERT, bundle.ca.certificate_pem, PUBLIC_MODE), *files]
        return [write_atomically(out_dir / name, data, mode=mode) for name, data, mode in files]
    except (authority.InvalidHost, authority.InvalidCA) as error:
        raise errors.InputError(str(error)) from error
    except OSError as error:
        raise errors.InputError(f"{error.filename or out_dir}: {error.strerror or error}") from error


def write_atomically(path: pathlib.Path, data: bytes, *, mode: int) -> pathlib.Path:
    """Write ``data`` to a temporary file created with ``mode`` and rename it over ``path``.

    The key never exists on disk with wider permissions, and a reader never sees half a file.
    """
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(descriptor, mode)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        pathlib.Path(temporary).unlink(missing_ok=True)
        raise
    return path


def _kept_ca(out_dir: pathlib.Path) -> authority.KeyPair | None:
    cert_path, key_path = out_dir / CA_CERT, out_dir / CA_KEY
    if not cert_path.exists() and not key_path.exists():
        return None
    if not (cert_path.exists() and key_path.exists()):
        missing = key_path if cert_path.exists() else cert_path
        raise errors.InputError(f"{missing}: missing (ca.crt and ca.key are reused together; remove both for a new CA)")
    try:
        return authority.load_ca(certificate_pem=cert_path.read_bytes(), key_pem=key_path.read_bytes())
    except authority.InvalidCA as error:
        raise errors.InputError(f"{out_dir}: {error}") from error
