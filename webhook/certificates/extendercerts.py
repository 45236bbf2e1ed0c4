"""``gpu-admission certs extender``: the scheduler extender's certificates, made by the install itself.

The extender serves HTTPS and asks every caller for a client certificate, because ``/bind`` binds
pods with its ServiceAccount's rights. Nothing has to be made by hand: the extender Pod's init
container runs this command, which keeps two Secrets in the install's namespace and writes the
files the extender serves from into a volume of the Pod (an ``emptyDir``):

- ``gpu-admission-extender-tls`` (``kubernetes.io/tls``): ``ca.crt`` (the trusted CAs, signing one
  first), ``ca.key``, and the serving pair ``tls.crt``/``tls.key`` for the extender Service's names.
  Issued and renewed by the same rules and code as the webhook's self-managed Secret
  (`certs.rotation` through `webhook.certificates.provision`), with no webhook configuration to inject into.
- ``gpu-admission-extender-client`` (``kubernetes.io/tls``): kube-scheduler's client pair
  (``tls.crt``/``tls.key``, CN ``gpu-admission-scheduler``) issued by that CA, and ``ca.crt``, the
  bundle kube-scheduler trusts the extender with. A scheduler in the cluster (the second-scheduler
  mode) mounts this Secret; a control-plane kube-scheduler gets its three files copied to the path
  its configuration names (``deploy/scheduler-config.yaml``).

The extender trusts client certificates from the same bundle (``--tls-client-ca-file``), so only
the holder of ``ca.key`` (this Secret, readable by the extender's ServiceAccount alone) can mint a
caller. Both replicas' init containers may race on a first install: every write is conditional
(create, or replace at the read resourceVersion), and the loser reads again and uses the winner's.
The extender loads its pair at start, so a renewed pair is served from the Pod's next start; the
serving certificate lives a year and is renewed 60 days ahead, far inside any rollout cadence.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import pathlib
import tempfile
from collections.abc import Mapping

from certs import authority, rotation
from webhook import kube
from webhook.certificates import provision
from webhook.cmdline import errors, flags

SERVICE = "gpu-admission-extender"
SERVING_SECRET = "gpu-admission-extender-tls"
CLIENT_SECRET = "gpu-admission-extender-client"
CLIENT_COMMON_NAME = "gpu-admission-scheduler"
CA_FILE = rotation.CA_CERT
CERT_FILE = rotation.TLS_CERT
KEY_FILE = rotation.TLS_KEY
_ATTEMPTS = 5  # conditional writes lost to the other replica before giving up


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClientPlan:
    """The client Secret's entries as they should be, and why they changed ("" when kept)."""

    entries: Mapping[str, bytes]
    reason: str = ""


def plan_client(
    serving: rotation.Material,
    current: Mapping[str, bytes],
    *,
    now: datetime.datetime,
    renew_before: datetime.timedelta = rotation.SERVING_RENEW_BEFORE,
) -> ClientPlan:
    """kube-scheduler's client pair for the extender whose material is ``serving`` (complete).

    Kept while it is valid, issued by a CA the extender still trusts and not yet due; otherwise
    issued anew from the signing CA. ``ca.crt`` always follows the extender's bundle."""
    if serving.ca is None:
        raise ValueError("the extender's material has no signing CA")
    bundle = serving.bundle_pem()
    parsed = rotation.parse({CERT_FILE: current.get(CERT_FILE, b""), KEY_FILE: current.get(KEY_FILE, b"")})
    pair = parsed.serving
    reason = ""
    if pair is None:
        reason = "; ".join(parsed.problems) or "no client certificate stored"
    elif rotation.expired(pair.certificate, now=now):
        reason = "the client certificate has expired"
    elif not any(rotation.signed_by(pair.certificate, ca) for ca in serving.trusted):
        reason = "the client certificate is signed by no CA the extender trusts"
    elif now >= rotation.renew_at(pair.certificate, renew_before=renew_before):
        reason = "the client certificate is due for renewal"
    if reason:
        pair = authority.issue_client(serving.ca, common_name=CLIENT_COMMON_NAME, now=now)
        reason = f"{reason}: issued a new one"
    assert pair is not None  # for mypy: kept or issued above
    entries = {CA_FILE: bundle, CERT_FILE: pair.certificate_pem, KEY_FILE: pair.key_pem}
    if not reason and current.get(CA_FILE) != bundle:
        reason = "the extender's CA bundle changed: ca.crt follows it"
    return ClientPlan(entries=entries, reason=reason)


def served_files(serving: rotation.Material) -> dict[str, bytes]:
    """What the extender reads: its serving pair and the bundle it verifies callers with."""
    if serving.serving is None:
        raise ValueError("the extender's material has no serving pair")
    return {CA_FILE: serving.bundle_pem(), CERT_FILE: serving.serving.certificate_pem, KEY_FILE: serving.serving.key_pem}


def ensure(
    serving_store: provision.Store,
    client_store: provision.Store,
    *,
    hosts: tuple[str, ...],
    now: datetime.datetime,
) -> tuple[rotation.Material, list[str]]:
    """Create or renew both Secrets; the extender's material and what was done, one line each."""
    done: list[str] = []
    for attempt in range(_ATTEMPTS):
        try:
            outcome = provision.reconcile(serving_store, provision.NoClients(), hosts=hosts, now=now)
            done += [f"{serving_store.describe()}: {reason}" for reason in outcome.reasons]
            material = outcome.material
            stored = client_store.read()
            plan = plan_client(material, dict(stored.entries) if stored is not None else {}, now=now)
            if plan.reason:
                client_store.write(plan.entries, previous=stored)
                done.append(f"{client_store.describe()}: {plan.reason}")
            return material, done
        except kube.errors.Conflict:
            if attempt == _ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")  # the loop returns or raises


def write_files(directory: pathlib.Path, files: Mapping[str, bytes]) -> list[pathlib.Path]:
    """Write each file atomically, keys 0600 and certificates 0644; the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written: list[pathlib.Path] = []
    for name in (KEY_FILE, CERT_FILE, CA_FILE):  # the key first: a reader never pairs a new cert with an old key
        mode = 0o600 if name == KEY_FILE else 0o644
        descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
        try:
            os.fchmod(descriptor, mode)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(files[name])
            os.replace(temporary, directory / name)
        except BaseException:
            pathlib.Path(temporary).unlink(missing_ok=True)
            raise
        written.append(directory / name)
    return written


# --- the command ----------------------------------------------------------------------------------


def add_action(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``certs extender`` on the ``certs`` command."""
    parser = actions.add_parser(
        "extender",
        help="the scheduler extender's serving pair and kube-scheduler's client pair, in two Secrets",
        description=f"Create or renew the Secrets {SERVING_SECRET} (CA and serving pair for the extender Service) and "
        f"{CLIENT_SECRET} (kube-scheduler's client pair from the same CA), then write tls.crt, tls.key and ca.crt "
        "for the extender into --out-dir. Run by the extender Pod's init container.",
    )
    parser.add_argument("--out-dir", metavar="DIR", help="write the extender's tls.crt, tls.key and ca.crt here")
    flags.add_cluster(parser)
    flags.add_namespaces(
        parser,
        namespace_help=f"namespace of the Secrets (default: {provision.DEFAULT_NAMESPACE})",
        all_help=None,
        default=provision.DEFAULT_NAMESPACE,
    )
    parser.add_argument("--service", default=SERVICE, metavar="NAME", help=f"the extender's Service (default: {SERVICE})")
    parser.add_argument("--host", action="append", default=[], metavar="NAME", help="one more SAN (DNS name or IP), repeatable")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    api = flags.api_client(args)
    try:
        serving_store = provision.SecretStore(api, namespace=args.namespace, name=SERVING_SECRET)
        client_store = provision.SecretStore(api, namespace=args.namespace, name=CLIENT_SECRET)
        hosts = tuple(dict.fromkeys((*provision.service_hosts(args.service, args.namespace), *args.host)))
        try:
            material, done = ensure(serving_store, client_store, hosts=hosts, now=datetime.datetime.now(datetime.UTC))
        except kube.errors.KubeError as error:
            raise errors.InputError(str(error)) from error
        except authority.InvalidHost as error:
            raise errors.InputError(str(error)) from error
    finally:
        kube.close(api)
    for line in done or [f"{serving_store.describe()}, {client_store.describe()}: nothing to renew"]:
        print(line)
    if args.out_dir:
        try:
            for path in write_files(pathlib.Path(args.out_dir), served_files(material)):
                print(path)
        except OSError as error:
            raise errors.InputError(f"{error.filename or args.out_dir}: {error.strerror or error}") from error
    return 0
