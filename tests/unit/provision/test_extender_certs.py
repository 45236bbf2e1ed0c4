"""The extender's certificates come from the install itself: two Secrets made and renewed by the
init container, a serving pair kube-scheduler can verify and a client pair the extender accepts."""

from __future__ import annotations

import datetime
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs import authority, rotation
from tests.unit.provision.conftest import MemoryStore
from webhook import cli
from webhook.certificates import extendercerts, provision

NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
HOSTS = provision.service_hosts(extendercerts.SERVICE, provision.DEFAULT_NAMESPACE)


def certificate(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def stored(store: MemoryStore) -> dict[str, bytes]:
    assert store.stored is not None
    return dict(store.stored.entries)


def test_a_first_install_writes_both_secrets_with_a_client_pair_from_the_extenders_ca() -> None:
    serving, client = MemoryStore(), MemoryStore()
    material, done = extendercerts.ensure(serving, client, hosts=HOSTS, now=NOW)
    assert sorted(stored(serving)) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    assert sorted(stored(client)) == ["ca.crt", "tls.crt", "tls.key"], "the CA key never leaves the extender's Secret"
    assert material.ca is not None and material.serving is not None
    assert rotation.covers(material.serving.certificate, HOSTS)
    issued = certificate(stored(client)["tls.crt"])
    assert rotation.signed_by(issued, material.ca.certificate)
    assert issued.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == extendercerts.CLIENT_COMMON_NAME
    usages = issued.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages and ExtendedKeyUsageOID.SERVER_AUTH not in usages
    assert stored(client)["ca.crt"] == stored(serving)["ca.crt"] == extendercerts.served_files(material)["ca.crt"]
    assert len(done) == 3 and any("client certificate" in line for line in done)


def test_a_second_run_writes_nothing() -> None:
    serving, client = MemoryStore(), MemoryStore()
    extendercerts.ensure(serving, client, hosts=HOSTS, now=NOW)
    _, done = extendercerts.ensure(serving, client, hosts=HOSTS, now=NOW + datetime.timedelta(days=30))
    assert done == [] and serving.writes == 1 and client.writes == 1


def test_the_replica_that_loses_the_race_uses_the_winners_certificates() -> None:
    serving, client = MemoryStore(), MemoryStore()
    winner, _ = extendercerts.ensure(serving, client, hosts=HOSTS, now=NOW)
    reads = {"count": 0}
    real_read = serving.read

    def stale_first() -> provision.Stored | None:  # the loser read before the winner wrote
        reads["count"] += 1
        return None if reads["count"] == 1 else real_read()

    serving.read = stale_first  # type: ignore[method-assign]  # a view taken before the other replica's write
    loser, _ = extendercerts.ensure(serving, client, hosts=HOSTS, now=NOW)
    assert serving.writes == 1 and client.writes == 1
    assert loser.serving is not None and winner.serving is not None
    assert loser.serving.certificate == winner.serving.certificate


def test_a_client_pair_due_for_renewal_or_from_a_dropped_ca_is_issued_again_and_a_fresh_one_kept() -> None:
    serving, client = MemoryStore(), MemoryStore()
    material, _ = extendercerts.ensure(serving, client, hosts=HOSTS, now=NOW)
    current = stored(client)
    assert extendercerts.plan_client(material, current, now=NOW + datetime.timedelta(days=30)).reason == ""
    due = extendercerts.plan_client(material, current, now=NOW + datetime.timedelta(days=310))
    assert "due for renewal" in due.reason and due.entries["tls.crt"] != current["tls.crt"]
    other = authority.issue_ca(now=NOW)
    foreign = authority.issue_client(other, common_name="someone", now=NOW)
    forged = extendercerts.plan_client(
        material, {**current, "tls.crt": foreign.certificate_pem, "tls.key": foreign.key_pem}, now=NOW
    )
    assert "signed by no CA the extender trusts" in forged.reason
    assert material.ca is not None and rotation.signed_by(certificate(forged.entries["tls.crt"]), material.ca.certificate)


def test_garbage_in_the_client_secret_is_replaced_not_raised() -> None:
    serving, client = MemoryStore(), MemoryStore()
    material, _ = extendercerts.ensure(serving, client, hosts=HOSTS, now=NOW)
    plan = extendercerts.plan_client(material, {"tls.crt": b"not a certificate", "tls.key": b"\x00"}, now=NOW)
    assert plan.reason.endswith("issued a new one") and sorted(plan.entries) == ["ca.crt", "tls.crt", "tls.key"]


def test_a_new_ca_bundle_reaches_the_client_secrets_ca_crt_without_a_new_pair() -> None:
    serving, client = MemoryStore(), MemoryStore()
    material, _ = extendercerts.ensure(serving, client, hosts=HOSTS, now=NOW)
    current = {**stored(client), "ca.crt": b""}
    plan = extendercerts.plan_client(material, current, now=NOW)
    assert "ca.crt follows" in plan.reason and plan.entries["tls.crt"] == current["tls.crt"]


def test_kube_scheduler_with_the_client_pair_completes_mutual_tls_with_the_extender_and_a_stranger_does_not(
    tmp_path: Path,
) -> None:
    serving, client = MemoryStore(), MemoryStore()
    material, _ = extendercerts.ensure(serving, client, hosts=HOSTS, now=datetime.datetime.now(datetime.UTC))
    served = tmp_path / "extender"
    extendercerts.write_files(served, extendercerts.served_files(material))
    scheduler = tmp_path / "scheduler"
    extendercerts.write_files(scheduler, stored(client))
    stranger = tmp_path / "stranger"
    other = authority.issue_ca(now=datetime.datetime.now(datetime.UTC))
    pair = authority.issue_client(other, common_name=extendercerts.CLIENT_COMMON_NAME, now=datetime.datetime.now(datetime.UTC))
    extendercerts.write_files(
        stranger, {"ca.crt": stored(client)["ca.crt"], "tls.crt": pair.certificate_pem, "tls.key": pair.key_pem}
    )

    def handshake(caller: Path) -> bool:
        server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_context.load_cert_chain(served / "tls.crt", served / "tls.key")
        server_context.load_verify_locations(served / "ca.crt")
        server_context.verify_mode = ssl.CERT_REQUIRED
        client_context = ssl.create_default_context(cafile=str(caller / "ca.crt"))
        client_context.load_cert_chain(caller / "tls.crt", caller / "tls.key")
        server_in, server_out, client_in, client_out = (ssl.MemoryBIO() for _ in range(4))
        server = server_context.wrap_bio(server_in, server_out, server_side=True)
        peer = client_context.wrap_bio(client_in, client_out, server_hostname=f"{extendercerts.SERVICE}.gpu-admission.svc")
        done = {"server": False, "client": False}
        for _ in range(10):
            for name, side, _inbox, outbox, other_inbox in (
                ("client", peer, client_in, client_out, server_in),
                ("server", server, server_in, server_out, client_in),
            ):
                if not done[name]:
                    try:
                        side.do_handshake()
                        done[name] = True
                    except ssl.SSLWantReadError:
                        pass
                    except ssl.SSLError:
                        return False
                other_inbox.write(outbox.read())
            if all(done.values()):
                try:  # TLS 1.3: the server judges the client certificate after the client thinks it is done
                    server.read(1)
                except ssl.SSLWantReadError:
                    return True
                except ssl.SSLError:
                    return False
        return False

    assert handshake(scheduler)
    assert not handshake(stranger)


def test_files_are_written_with_the_key_private(tmp_path: Path) -> None:
    serving, client = MemoryStore(), MemoryStore()
    material, _ = extendercerts.ensure(serving, client, hosts=HOSTS, now=NOW)
    written = extendercerts.write_files(tmp_path / "tls", extendercerts.served_files(material))
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in written}
    assert modes == {"tls.key": 0o600, "tls.crt": 0o644, "ca.crt": 0o644}
    assert sorted(p.name for p in (tmp_path / "tls").iterdir()) == ["ca.crt", "tls.crt", "tls.key"], "no temporary file left"


def test_the_command_is_certs_extender_with_the_flags_the_manifest_passes() -> None:
    args = cli.make_parser().parse_args(["certs", "extender", "--out-dir=/etc/gpu-admission/tls"])
    assert args.func is extendercerts.run and args.out_dir == "/etc/gpu-admission/tls" and args.namespace == "gpu-admission"


@pytest.mark.parametrize("host", ["bad host", "-x"])
def test_a_bad_extra_host_is_one_clear_error(host: str) -> None:
    with pytest.raises(authority.InvalidHost):
        extendercerts.ensure(MemoryStore(), MemoryStore(), hosts=(*HOSTS, host), now=NOW)
