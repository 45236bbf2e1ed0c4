"""Key material of the local control plane, written as files: a cluster CA, the apiserver's serving
certificate, the admin client certificate and the service-account signing key."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from certs import authority
from webhook.certificates import certfiles

APISERVER_HOSTS = ("127.0.0.1", "localhost", "kubernetes", "kubernetes.default.svc", "10.0.0.1")


def write_all(directory: Path) -> None:
    """Create every file the components need under `directory` (ca, apiserver, admin, sa)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca = authority.issue_ca(now=now, common_name="gpu-admission local cluster CA")
    pairs = {
        "ca": ca,
        "apiserver": authority.issue_serving(ca, hosts=APISERVER_HOSTS, now=now),
        "admin": authority.issue_client(ca, common_name="gpu-admission-admin", organizations=("system:masters",), now=now),
    }
    for name, pair in pairs.items():
        certfiles.write_atomically(directory / f"{name}.crt", pair.certificate_pem, mode=0o644)
        certfiles.write_atomically(directory / f"{name}.key", pair.key_pem, mode=certfiles.SECRET_MODE)
    # Service-account tokens are signed with RSA: every token consumer accepts RS256.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    certfiles.write_atomically(
        directory / "sa.key",
        sa_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        mode=certfiles.SECRET_MODE,
    )
    certfiles.write_atomically(
        directory / "sa.pub",
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
        mode=0o644,
    )
