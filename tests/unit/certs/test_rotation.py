"""Rotation decisions: when the CA and serving certificate are renewed, and what the bundle trusts."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509

from certs import authority, rotation

NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
HOSTS = ("gpu-admission-webhook.gpu-admission.svc", "127.0.0.1")
DAY = datetime.timedelta(days=1)


def fresh(policy: rotation.Policy = rotation.Policy()) -> rotation.Material:
    plan = rotation.reconcile(rotation.Material(), hosts=HOSTS, now=NOW, policy=policy)
    return plan.material


def stored(material: rotation.Material) -> rotation.Material:
    """The material as read back from storage (what a second pass sees)."""
    return rotation.parse(material.files())


def cert(pair: authority.KeyPair | None) -> x509.Certificate | None:
    """Key pairs compare by their certificates (private key objects compare by identity)."""
    return None if pair is None else pair.certificate


def test_nothing_stored_issues_a_ca_and_a_serving_certificate_it_signs() -> None:
    plan = rotation.reconcile(rotation.Material(), hosts=HOSTS, now=NOW)
    assert plan.changed
    material = plan.material
    assert material.ca is not None and material.serving is not None
    assert material.trusted == (material.ca.certificate,)
    assert rotation.signed_by(material.serving.certificate, material.ca.certificate)
    assert rotation.covers(material.serving.certificate, HOSTS)
    assert material.serving.certificate.not_valid_after_utc == NOW + authority.SERVING_VALIDITY
    assert material.ca.certificate.not_valid_after_utc == NOW + authority.CA_VALIDITY


def test_a_second_pass_over_stored_material_changes_nothing() -> None:
    material = stored(fresh())
    plan = rotation.reconcile(material, hosts=HOSTS, now=NOW + DAY)
    assert not plan.changed and plan.waiting == ""
    assert cert(plan.material.serving) == cert(material.serving) and cert(plan.material.ca) == cert(material.ca)


def test_the_serving_certificate_is_renewed_sixty_days_before_it_expires_and_not_a_second_earlier() -> None:
    material = stored(fresh())
    renew = NOW + authority.SERVING_VALIDITY - rotation.SERVING_RENEW_BEFORE
    assert not rotation.reconcile(material, hosts=HOSTS, now=renew - datetime.timedelta(seconds=1)).changed
    plan = rotation.reconcile(material, hosts=HOSTS, now=renew)
    assert plan.changed and "expires" in plan.reasons[0]
    assert cert(plan.material.ca) == cert(material.ca), "a serving renewal keeps the CA"
    assert plan.material.serving is not None and material.serving is not None
    assert plan.material.serving.certificate.serial_number != material.serving.certificate.serial_number


def test_renewal_timing_follows_a_short_test_policy() -> None:
    second = datetime.timedelta(seconds=1)
    short = {
        "serving_validity": 20 * second,
        "serving_renew_before": 12 * second,
        "ca_validity": 60 * second,
        "ca_renew_before": 30 * second,
        "ca_propagation": 2 * second,
    }
    policy = rotation.Policy(**short)
    material = stored(fresh(policy))
    assert not rotation.reconcile(material, hosts=HOSTS, now=NOW + 7 * second, policy=policy).changed
    assert rotation.reconcile(material, hosts=HOSTS, now=NOW + 8 * second, policy=policy).changed


def test_a_new_host_gets_a_new_serving_certificate() -> None:
    material = stored(fresh())
    plan = rotation.reconcile(material, hosts=(*HOSTS, "extra.example"), now=NOW)
    assert plan.changed and "host" in plan.reasons[0]
    assert plan.material.serving is not None and rotation.covers(plan.material.serving.certificate, (*HOSTS, "extra.example"))


def test_a_ca_rotation_keeps_the_old_ca_trusted_and_the_old_serving_certificate_until_clients_trust_the_new_one() -> None:
    due = NOW + authority.CA_VALIDITY - rotation.CA_RENEW_BEFORE
    # Nine years on, the CA is due; the serving certificate was renewed a day ago.
    material = stored(rotation.reconcile(stored(fresh()), hosts=HOSTS, now=due - DAY, rotate_serving=True).material)
    old_ca = material.ca
    assert old_ca is not None

    # Step 1: a new CA joins the bundle, first; the serving certificate is not touched yet.
    step1 = rotation.reconcile(material, hosts=HOSTS, now=due, client_bundles=[material.bundle_pem()])
    assert step1.changed and "new CA" in step1.reasons[0]
    new_ca = step1.material.ca
    assert new_ca is not None and new_ca.certificate != old_ca.certificate
    assert step1.material.trusted == (new_ca.certificate, old_ca.certificate)
    assert cert(step1.material.serving) == cert(material.serving)
    assert "do not trust the new CA" in step1.waiting

    after_step1 = stored(step1.material)
    assert cert(after_step1.ca) == cert(new_ca), "ca.key names the signing CA even with two CAs in ca.crt"

    # Clients that still hold only the old bundle hold the serving certificate back.
    held = rotation.reconcile(after_step1, hosts=HOSTS, now=due + DAY, client_bundles=[material.bundle_pem()])
    assert not held.changed and "do not trust" in held.waiting

    # Injected, but too soon after the new CA was issued.
    injected = [after_step1.bundle_pem(), after_step1.bundle_pem()]
    early = rotation.reconcile(after_step1, hosts=HOSTS, now=due + datetime.timedelta(seconds=30), client_bundles=injected)
    assert not early.changed and "propagates" in early.waiting

    # Step 2: every client trusts the new CA and it had time to propagate.
    step2 = rotation.reconcile(after_step1, hosts=HOSTS, now=due + rotation.CA_PROPAGATION, client_bundles=injected)
    assert step2.changed and step2.waiting == ""
    assert step2.material.serving is not None
    assert rotation.signed_by(step2.material.serving.certificate, new_ca.certificate)
    assert step2.material.trusted == (new_ca.certificate, old_ca.certificate), "the old CA stays until it expires"


def test_an_expired_old_ca_leaves_the_bundle() -> None:
    material = stored(fresh())
    assert material.ca is not None
    rotated = rotation.reconcile(material, hosts=HOSTS, now=NOW, rotate_ca=True, client_bundles=())
    two = stored(rotated.material)
    assert len(two.trusted) == 2
    later = NOW + authority.CA_VALIDITY + DAY
    merged = rotation.merge_bundle(two.trusted, current=two.trusted[0], now=later)
    assert merged == (two.trusted[0],)


def test_merge_bundle_puts_the_current_ca_first_once_and_keeps_the_order_of_the_rest() -> None:
    a, b, c = (authority.issue_ca(now=NOW).certificate for _ in range(3))
    assert rotation.merge_bundle([a, b, c, b], current=c, now=NOW) == (c, a, b)


def test_with_no_webhook_configurations_there_is_nothing_to_wait_for_beyond_propagation() -> None:
    material = stored(fresh())
    step1 = stored(rotation.reconcile(material, hosts=HOSTS, now=NOW, rotate_ca=True, client_bundles=()).material)
    step2 = rotation.reconcile(step1, hosts=HOSTS, now=NOW + rotation.CA_PROPAGATION, client_bundles=())
    assert step2.changed and step2.material.serving is not None and step1.ca is not None
    assert rotation.signed_by(step2.material.serving.certificate, step1.ca.certificate)


def test_without_knowing_the_clients_a_serving_certificate_from_the_new_ca_is_issued_only_on_request() -> None:
    material = stored(fresh())
    step1 = stored(rotation.reconcile(material, hosts=HOSTS, now=NOW, rotate_ca=True, client_bundles=None).material)
    waiting = rotation.reconcile(step1, hosts=HOSTS, now=NOW + 10 * DAY, client_bundles=None)
    assert not waiting.changed and "previous CA" in waiting.waiting
    forced = rotation.reconcile(step1, hosts=HOSTS, now=NOW + 10 * DAY, client_bundles=None, rotate_serving=True)
    assert forced.changed and forced.material.serving is not None and step1.ca is not None
    assert rotation.signed_by(forced.material.serving.certificate, step1.ca.certificate)


def test_an_expired_serving_certificate_is_replaced_at_once_even_during_a_ca_rotation() -> None:
    material = stored(fresh(rotation.Policy(serving_validity=datetime.timedelta(days=10), serving_renew_before=DAY)))
    later = NOW + 11 * DAY
    plan = rotation.reconcile(material, hosts=HOSTS, now=later, rotate_ca=True, client_bundles=[material.bundle_pem()])
    assert plan.material.serving is not None and plan.material.ca is not None
    assert rotation.signed_by(plan.material.serving.certificate, plan.material.ca.certificate)
    assert plan.waiting == ""


def test_an_expired_ca_is_replaced_with_everything_it_signed() -> None:
    material = stored(fresh())
    plan = rotation.reconcile(material, hosts=HOSTS, now=NOW + authority.CA_VALIDITY + DAY)
    assert plan.material.ca is not None and plan.material.serving is not None
    assert plan.material.trusted == (plan.material.ca.certificate,)
    assert rotation.signed_by(plan.material.serving.certificate, plan.material.ca.certificate)


def test_rotate_serving_issues_a_new_pair_from_the_same_ca() -> None:
    material = stored(fresh())
    plan = rotation.reconcile(material, hosts=HOSTS, now=NOW, rotate_serving=True)
    assert plan.changed and cert(plan.material.ca) == cert(material.ca) and cert(plan.material.serving) != cert(material.serving)


@pytest.mark.parametrize(
    ("entries", "problem"),
    [
        ({"ca.crt": b"garbage"}, "ca.crt: not a PEM certificate bundle"),
        ({"tls.crt": b"garbage", "tls.key": b"garbage"}, "tls.crt: not a PEM certificate"),
    ],
)
def test_unparsable_entries_are_problems_not_exceptions(entries: dict[str, bytes], problem: str) -> None:
    material = rotation.parse(entries)
    assert any(p.startswith(problem) for p in material.problems)


def test_mismatched_keys_are_problems_and_get_replaced() -> None:
    one, two = stored(fresh()), stored(fresh())
    mixed = {**one.files(), "tls.key": two.files()["tls.key"], "ca.key": two.files()["ca.key"]}
    material = rotation.parse(mixed)
    assert material.serving is None and material.ca is None
    assert "tls.key does not match tls.crt" in material.problems
    assert "ca.key matches no certificate in ca.crt" in material.problems
    plan = rotation.reconcile(material, hosts=HOSTS, now=NOW, client_bundles=[one.bundle_pem()])
    assert plan.changed and plan.material.serving is not None
    # The old CA is kept in the bundle: only its key was lost.
    assert one.trusted[0] in plan.material.trusted


def test_a_serving_certificate_signed_by_a_ca_nobody_trusts_is_replaced() -> None:
    one, two = stored(fresh()), stored(fresh())
    mixed = rotation.parse({**one.files(), "tls.crt": two.files()["tls.crt"], "tls.key": two.files()["tls.key"]})
    plan = rotation.reconcile(mixed, hosts=HOSTS, now=NOW)
    assert plan.changed and "no trusted CA" in plan.reasons[0]


def test_files_round_trip_through_parse() -> None:
    material = stored(fresh())
    again = rotation.parse(material.files())
    assert (again.trusted, cert(again.ca), cert(again.serving), again.problems) == (
        material.trusted,
        cert(material.ca),
        cert(material.serving),
        (),
    )
    assert x509.load_pem_x509_certificates(material.files()["ca.crt"]) == list(material.trusted)


def test_sans_lists_dns_names_and_addresses() -> None:
    material = stored(fresh())
    assert material.serving is not None
    assert rotation.sans(material.serving.certificate) == HOSTS


@pytest.mark.parametrize(
    "policy",
    [
        dict(serving_renew_before=authority.SERVING_VALIDITY),
        dict(ca_renew_before=datetime.timedelta(days=30)),
        dict(ca_propagation=datetime.timedelta(seconds=-1)),
        dict(serving_validity=datetime.timedelta(0)),
    ],
)
def test_policies_that_cannot_work_are_refused(policy: dict[str, datetime.timedelta]) -> None:
    with pytest.raises(rotation.InvalidPolicy):
        rotation.Policy(**policy)
