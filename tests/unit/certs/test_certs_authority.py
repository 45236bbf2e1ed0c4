"""The certs module issues a verifiable ECDSA chain whose SANs cover every host."""

from __future__ import annotations

import datetime
import ipaddress

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID

from certs import authority

NOW = datetime.datetime(2026, 1, 15, 12, 0, tzinfo=datetime.UTC)


def _verify(bundle: authority.Bundle, *, host: str, at: datetime.datetime) -> None:
    store = verification.Store([bundle.ca.certificate])
    builder = verification.PolicyBuilder().store(store).time(at)
    subject: x509.verification.Subject
    try:
        subject = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        subject = x509.DNSName(host)
    builder.build_server_verifier(subject).verify(bundle.serving.certificate, [])


def test_every_host_becomes_a_san_of_the_right_type() -> None:
    bundle = authority.issue_bundle(hosts=("gpu-admission.gpu-admission.svc", "localhost", "127.0.0.1", "::1"), now=NOW)
    sans = bundle.serving.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["gpu-admission.gpu-admission.svc", "localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]


def test_the_serving_certificate_verifies_against_the_ca_for_each_host() -> None:
    hosts = ("webhook.example.svc", "10.0.0.7")
    bundle = authority.issue_bundle(hosts=hosts, now=NOW)
    for host in hosts:
        _verify(bundle, host=host, at=NOW)


def test_the_serving_certificate_does_not_verify_for_another_host() -> None:
    bundle = authority.issue_bundle(hosts=("webhook.example.svc",), now=NOW)
    with pytest.raises(verification.VerificationError):
        _verify(bundle, host="other.example.svc", at=NOW)


def test_keys_are_ecdsa_p256_and_the_leaf_is_for_server_auth_only() -> None:
    bundle = authority.issue_bundle(hosts=("localhost",), now=NOW)
    for pair in (bundle.ca, bundle.serving):
        assert isinstance(pair.key.curve, ec.SECP256R1)
    leaf = bundle.serving.certificate
    assert leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == x509.ExtendedKeyUsage(
        [ExtendedKeyUsageOID.SERVER_AUTH]
    )
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    ca_constraints = bundle.ca.certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert (ca_constraints.ca, ca_constraints.path_length) == (True, 0)


def test_validity_is_ten_years_for_the_ca_and_one_year_for_the_leaf_with_clock_skew_allowance() -> None:
    bundle = authority.issue_bundle(hosts=("localhost",), now=NOW)
    ca, leaf = bundle.ca.certificate, bundle.serving.certificate
    assert ca.not_valid_before_utc == leaf.not_valid_before_utc == NOW - datetime.timedelta(minutes=5)
    assert ca.not_valid_after_utc == NOW + datetime.timedelta(days=3650)
    assert leaf.not_valid_after_utc == NOW + datetime.timedelta(days=365)
    _verify(bundle, host="localhost", at=NOW + datetime.timedelta(days=364))
    with pytest.raises(verification.VerificationError):
        _verify(bundle, host="localhost", at=NOW + datetime.timedelta(days=366))


def test_a_kept_ca_signs_the_rotated_leaf_which_verifies_with_the_unchanged_ca() -> None:
    first = authority.issue_bundle(hosts=("localhost",), now=NOW)
    kept = authority.load_ca(certificate_pem=first.ca.certificate_pem, key_pem=first.ca.key_pem)
    later = NOW + datetime.timedelta(days=300)
    rotated = authority.issue_bundle(hosts=("localhost",), now=later, ca=kept)
    assert rotated.ca.certificate == first.ca.certificate
    assert rotated.serving.certificate.serial_number != first.serving.certificate.serial_number
    _verify(authority.Bundle(ca=first.ca, serving=rotated.serving), host="localhost", at=later)


def test_a_leaf_never_outlives_its_ca() -> None:
    first = authority.issue_bundle(hosts=("localhost",), now=NOW)
    near_ca_end = first.ca.certificate.not_valid_after_utc - datetime.timedelta(days=30)
    rotated = authority.issue_serving(first.ca, hosts=("localhost",), now=near_ca_end)
    assert rotated.certificate.not_valid_after_utc == first.ca.certificate.not_valid_after_utc


@pytest.mark.parametrize("host", ["", "bad host", "-leading.example", "a..b", "x" * 64 + ".example"])
def test_a_host_that_is_neither_ip_nor_dns_name_is_refused(host: str) -> None:
    with pytest.raises(authority.InvalidHost):
        authority.issue_bundle(hosts=(host,), now=NOW)


def test_no_hosts_is_refused() -> None:
    with pytest.raises(authority.InvalidHost):
        authority.subject_alternative_names(())


def test_a_mismatched_ca_key_is_refused() -> None:
    one = authority.issue_ca(now=NOW)
    other = authority.issue_ca(now=NOW)
    with pytest.raises(authority.InvalidCA, match="does not match"):
        authority.load_ca(certificate_pem=one.certificate_pem, key_pem=other.key_pem)


def test_a_leaf_cannot_be_kept_as_a_ca() -> None:
    bundle = authority.issue_bundle(hosts=("localhost",), now=NOW)
    with pytest.raises(authority.InvalidCA, match="not a CA"):
        authority.load_ca(certificate_pem=bundle.serving.certificate_pem, key_pem=bundle.serving.key_pem)


def test_a_long_host_name_is_a_san_but_not_the_common_name() -> None:
    host = ("a" * 60 + ".") * 3 + "example"
    leaf = authority.issue_bundle(hosts=(host,), now=NOW).serving.certificate
    assert leaf.subject == x509.Name([])
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.critical and san.value.get_values_for_type(x509.DNSName) == [host]


def test_a_client_certificate_names_user_and_groups_and_is_for_client_auth_only() -> None:
    ca = authority.issue_ca(now=NOW)
    client = authority.issue_client(ca, common_name="admin", organizations=("system:masters",), now=NOW)
    subject = client.certificate.subject
    assert subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)[0].value == "admin"
    assert subject.get_attributes_for_oid(x509.oid.NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    usages = client.certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    client.certificate.verify_directly_issued_by(ca.certificate)
    with pytest.raises(x509.ExtensionNotFound):
        client.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
