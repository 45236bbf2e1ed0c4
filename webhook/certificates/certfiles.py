"""``gpu-admission certs``: the webhook's CA and serving pair as files or in the cluster Secret, by hand.

- ``generate``: issue ``ca.crt``, ``ca.key`` (kept, mode 0600, so the serving certificate can be
  rotated without touching any caBundle), ``tls.crt`` and ``tls.key`` (0600) into ``--out-dir``;
  an existing CA there is reused and only the serving pair replaced.
- ``install``: put the certificates into the cluster Secret (the files of ``--out-dir``, or new ones
  when the Secret lacks them) and the CA into every caBundle of the webhook configurations.
- ``rotate``: a new serving pair from the current CA; with ``--ca`` a new CA first, kept in
  ``ca.crt`` beside the old one, injected, and, once it had time to propagate, the serving pair
  re-issued from it (with files and no cluster: the first step only, and what to do next).
- ``show``: the CAs and the serving certificate, when they expire and when they are renewed.

Files or cluster: ``--out-dir`` selects the files; without it the Secret (``--namespace``,
``--certs-secret``, ``--kubeconfig``) is used. The same renewal rules as ``serve
--self-managed-certs`` apply (`certs.rotation`), through the same store/clients code
(`webhook.certificates.provision`).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import pathlib
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import yaml
from cryptography import x509

from certs import authority, rotation
from webhook import kube
from webhook.certificates import extendercerts, provision
from webhook.cmdline import errors, flags, output

CA_CERT = rotation.CA_CERT
CA_KEY = rotation.CA_KEY
TLS_CERT = rotation.TLS_CERT
TLS_KEY = rotation.TLS_KEY
PUBLIC_MODE = 0o644
SECRET_MODE = 0o600
_MODES = {CA_CERT: PUBLIC_MODE, CA_KEY: SECRET_MODE, TLS_CERT: PUBLIC_MODE, TLS_KEY: SECRET_MODE}
# Written in this order: a reader of the serving pair sees the key change before the certificate,
# and `tls.FileWatch` retries a pair that does not match until both are new.
_WRITE_ORDER = (CA_KEY, CA_CERT, TLS_KEY, TLS_CERT)


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

    install = actions.add_parser(
        "install",
        help="write the certificates into the cluster Secret and inject the CA into the webhook configurations",
        description="With --out-dir, the four files go into the Secret as they are; without, the Secret is "
        "completed (a CA and serving pair issued where missing or due). Then every webhook entry's caBundle "
        "is set to ca.crt.",
    )
    _location(install, files_help="take the four files from DIR instead of issuing")
    install.set_defaults(func=run_install)

    rotate = actions.add_parser(
        "rotate",
        help="issue a new serving pair; --ca: a new CA first, both CAs trusted during the change",
        description="Without --ca: a new serving pair from the current CA. With --ca: a new CA joins ca.crt "
        "beside the old one and is injected into the webhook configurations; after --propagation-delay the "
        "serving pair is re-issued from it. With --out-dir and no --webhook-configuration only the first step "
        "runs: put ca.crt into every caBundle, then run `certs rotate` again for the serving pair.",
    )
    _location(rotate, files_help="rotate the files in DIR instead of the Secret")
    rotate.add_argument("--ca", action="store_true", help="rotate the CA (two steps, zero downtime)")
    rotate.add_argument(
        "--propagation-delay",
        type=flags.duration_delta,
        default=rotation.CA_PROPAGATION,
        metavar="DURATION",
        help="with --ca: wait this long after injecting the new CA before serving from it (default: 60s)",
    )
    rotate.set_defaults(func=run_rotate)

    show = actions.add_parser("show", help="expiry and renewal dates of the CAs and the serving certificate")
    _location(show, files_help="show the files in DIR instead of the Secret")
    flags.add_output(show, ("table", "json", "yaml"))
    flags.add_output_file(show)
    show.set_defaults(func=run_show)

    extendercerts.add_action(actions)


def _location(parser: argparse.ArgumentParser, *, files_help: str) -> None:
    parser.add_argument("--out-dir", metavar="DIR", help=files_help)
    flags.add_cluster(parser)
    flags.add_namespaces(
        parser,
        namespace_help=f"namespace of the Secret (default: {provision.DEFAULT_NAMESPACE})",
        all_help=None,
        default=provision.DEFAULT_NAMESPACE,
    )
    parser.add_argument("--certs-secret", default=provision.SECRET, metavar="NAME", help=f"default: {provision.SECRET}")
    parser.add_argument(
        "--service",
        default=provision.SERVICE,
        metavar="NAME",
        help=f"Service the certificate is for (default: {provision.SERVICE})",
    )
    parser.add_argument(
        "--webhook-configuration",
        metavar="NAME",
        help=f"webhook configurations whose caBundle is kept in step (default with the Secret: {provision.WEBHOOK_CONFIGURATION}; "
        "with --out-dir: none unless given)",
    )
    parser.add_argument("--host", action="append", default=[], metavar="NAME", help="one more SAN (DNS name or IP), repeatable")


# --- generate -------------------------------------------------------------------------------------


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
    material = rotation.parse({CA_CERT: cert_path.read_bytes(), CA_KEY: key_path.read_bytes()})
    if material.ca is None:
        raise errors.InputError(f"{out_dir}: {'; '.join(material.problems) or 'no usable CA'}")
    return material.ca


# --- the file store -------------------------------------------------------------------------------


class FileStore:
    """The four files in one directory, as a `provision.Store`."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.directory = directory

    def describe(self) -> str:
        return str(self.directory)

    def read(self) -> provision.Stored | None:
        entries: dict[str, bytes] = {}
        for name in rotation.KEYS:
            path = self.directory / name
            try:
                entries[name] = path.read_bytes()
            except FileNotFoundError:
                continue
            except OSError as error:
                raise errors.InputError(f"{path}: {error.strerror or error}") from error
        return provision.Stored(entries=entries) if entries else None

    def write(self, entries: Mapping[str, bytes], *, previous: provision.Stored | None) -> None:
        before = dict(previous.entries) if previous is not None else {}
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for name in _WRITE_ORDER:
                if name in entries and entries[name] != before.get(name):
                    write_atomically(self.directory / name, entries[name], mode=_MODES[name])
        except OSError as error:
            raise errors.InputError(f"{error.filename or self.directory}: {error.strerror or error}") from error


# --- install / rotate / show ----------------------------------------------------------------------


def _store_and_clients(args: argparse.Namespace) -> tuple[provision.Store, provision.Clients | None, Any]:
    """The store (files or Secret), the clients (None: not reachable) and the API client to close."""
    configuration = args.webhook_configuration
    if args.out_dir:
        api = flags.api_client(args) if configuration else None
        clients = provision.WebhookClients(api, name=configuration) if api is not None and configuration else None
        return FileStore(pathlib.Path(args.out_dir)), clients, api
    api = flags.api_client(args)
    configuration = provision.WEBHOOK_CONFIGURATION if configuration is None else configuration
    store = provision.SecretStore(api, namespace=args.namespace, name=args.certs_secret)
    return store, (provision.WebhookClients(api, name=configuration) if configuration else provision.NoClients()), api


def _hosts(args: argparse.Namespace, current: rotation.Material) -> tuple[str, ...]:
    """The SANs to issue for: those of the current serving certificate, the Service's names (for the
    Secret), and every --host; never fewer than before."""
    kept = rotation.sans(current.serving.certificate) if current.serving is not None else ()
    service = provision.service_hosts(args.service, args.namespace) if not args.out_dir and args.service else ()
    hosts = tuple(dict.fromkeys((*kept, *service, *args.host)))
    if not hosts:
        raise errors.InputError("no host for the serving certificate: give --host")
    return hosts


def _cluster_errors(function: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Cluster failures as one line (`errors.InputError`)."""

    @functools.wraps(function)
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return function(args)
        except kube.errors.KubeError as error:
            raise errors.InputError(str(error)) from error

    return wrapper


@_cluster_errors
def run_install(args: argparse.Namespace) -> int:
    api = flags.api_client(args)
    try:
        secret = provision.SecretStore(api, namespace=args.namespace, name=args.certs_secret)
        configuration = provision.WEBHOOK_CONFIGURATION if args.webhook_configuration is None else args.webhook_configuration
        clients: provision.Clients = provision.WebhookClients(api, name=configuration) if configuration else provision.NoClients()
        if args.out_dir:
            material = provision.read(FileStore(pathlib.Path(args.out_dir)))
            if material.problems or material.ca is None or material.serving is None:
                raise errors.InputError(
                    f"{args.out_dir}: {'; '.join(material.problems) or 'needs ca.crt, ca.key, tls.crt and tls.key'}"
                )
            secret.write(material.files(), previous=secret.read())
            print(f"{secret.describe()}: written from {args.out_dir}")
            injected = clients.inject(material.bundle_pem())
        else:
            outcome = provision.reconcile(secret, clients, hosts=_hosts(args, provision.read(secret)), now=_now())
            _print_outcome(secret, outcome)
            injected = outcome.injected
        print(f"{clients.describe()}: {injected} caBundle(s) updated")
    finally:
        kube.close(api)
    return 0


@_cluster_errors
def run_rotate(args: argparse.Namespace) -> int:
    store, clients, api = _store_and_clients(args)
    try:
        policy = rotation.Policy(ca_propagation=args.propagation_delay)
    except rotation.InvalidPolicy as error:
        raise errors.InputError(str(error)) from error
    try:
        hosts = _hosts(args, provision.read(store))
        if not args.ca:
            outcome = provision.reconcile(store, clients, hosts=hosts, now=_now(), policy=policy, rotate_serving=True)
            _print_outcome(store, outcome)
            return 0 if not outcome.waiting else 1
        first = provision.reconcile(store, clients, hosts=hosts, now=_now(), policy=policy, rotate_ca=True)
        _print_outcome(store, first)
        if clients is None:
            print(
                f"next: put {pathlib.Path(args.out_dir) / CA_CERT} (both CAs) into every caBundle, then run "
                f"`gpu-admission certs rotate --out-dir {args.out_dir}` for a serving pair from the new CA"
            )
            return 0
        assert first.material.ca is not None  # reconcile always leaves a CA
        ready = rotation.issued_at(first.material.ca.certificate) + policy.ca_propagation
        wait = (ready - _now()).total_seconds()
        if wait > 0:
            print(f"waiting {wait:.0f}s for the new CA to propagate", flush=True)
            time.sleep(wait)
        second = provision.reconcile(store, clients, hosts=hosts, now=_now(), policy=policy)
        _print_outcome(store, second)
        return 0 if not second.waiting else 1
    finally:
        if api is not None:
            kube.close(api)


@_cluster_errors
def run_show(args: argparse.Namespace) -> int:
    store, clients, api = _store_and_clients(args)
    try:
        material = provision.read(store)
        bundles = clients.bundles() if clients is not None else None
    finally:
        if api is not None:
            kube.close(api)
    rows = describe(material, now=_now(), bundles=bundles)
    shown = {"source": store.describe(), "certificates": rows, "problems": list(material.problems)}
    if args.output == "json":
        text = json.dumps(shown, indent=2) + "\n"
    elif args.output == "yaml":
        text = yaml.safe_dump(shown, sort_keys=False)
    else:
        lines = [f"{store.describe()}:"]
        if not rows:
            lines.append("  nothing stored")
        for row in rows:
            trust = (
                "" if row["trustedByClients"] is None else f"  trusted by {row['trustedByClients']}/{row['clients']} caBundle(s)"
            )
            lines.append(
                f"  {row['role']:<10} {row['subject']:<44} expires {row['notAfter']} ({row['daysLeft']:.0f} d)"
                f"  renew {row['renewAt']}{trust}"
            )
        lines.extend(f"  problem: {problem}" for problem in material.problems)
        text = "\n".join(lines) + "\n"
    # The report is written whole even when it reports problems (the exit status says so).
    output.emit(text, path=args.output_file)
    return 0 if material.serving is not None and not material.problems else 1


def describe(material: rotation.Material, *, now: datetime.datetime, bundles: list[bytes] | None) -> list[dict[str, Any]]:
    """One row per certificate: the signing CA, older CAs still trusted, the serving certificate."""
    policy = rotation.Policy()
    rows: list[dict[str, Any]] = []
    for index, certificate in enumerate(material.trusted):
        signing = material.ca is not None and certificate == material.ca.certificate
        role = "ca" if signing else ("ca (old)" if index else "ca (no key)")
        rows.append(_row(role, certificate, now=now, renew_before=policy.ca_renew_before, bundles=bundles))
    if material.serving is not None:
        rows.append(
            _row("serving", material.serving.certificate, now=now, renew_before=policy.serving_renew_before, bundles=None)
        )
    return rows


def _row(
    role: str,
    certificate: x509.Certificate,
    *,
    now: datetime.datetime,
    renew_before: datetime.timedelta,
    bundles: list[bytes] | None,
) -> dict[str, Any]:
    names = certificate.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    subject = str(names[0].value) if names else ", ".join(rotation.sans(certificate))
    trusted = None
    if bundles is not None and role.startswith("ca"):
        trusted = sum(1 for pem in bundles if rotation.bundle_trusts(rotation.parse_bundle(pem), certificate))
    return {
        "role": role,
        "subject": subject,
        "notAfter": f"{certificate.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}",
        "daysLeft": (certificate.not_valid_after_utc - now).total_seconds() / 86400,
        "renewAt": f"{rotation.renew_at(certificate, renew_before=renew_before):%Y-%m-%dT%H:%M:%SZ}",
        "sans": list(rotation.sans(certificate)),
        "trustedByClients": trusted,
        "clients": len(bundles) if bundles is not None else None,
    }


def _print_outcome(store: provision.Store, outcome: provision.Outcome) -> None:
    for reason in outcome.reasons:
        print(f"{store.describe()}: {reason}")
    if not outcome.reasons:
        print(f"{store.describe()}: nothing to renew")
    if outcome.waiting:
        print(f"{store.describe()}: {outcome.waiting}")


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
