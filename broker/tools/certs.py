"""``tandem certs dev DIR``: a throwaway CA and a certificate and key per node, for TLS on one
machine (tests, ``tandem cluster up --tls``, trying it out).  Never for production: the CA's
key sits next to the certificates it signed.

Files in DIR::

    ca.crt              the CA certificate: the nodes' --tls-ca, the clients' ?ca=DIR/ca.crt
    ca.key              the CA's key (mode 0600)
    NODE.crt, NODE.key  each node's certificate and key (key mode 0600); the certificate names
                        the node (its CN and a DNS name), localhost, 127.0.0.1, ::1 and --hosts
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client.errors import InvalidArgumentError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
VALID_DAYS = 365


@dataclass(frozen=True, slots=True)
class DevCerts:
    dir: Path
    ca: Path
    nodes: dict[str, tuple[Path, Path]]  # name -> (certificate, key)

    def node_args(self, name: str) -> list[str]:
        """``tandem broker start`` flags for node ``name``."""
        cert, key = self.nodes[name]
        return ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(self.ca)]


def _write(path: Path, data: bytes, *, secret: bool) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _san(host: str) -> Any:
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_dev_certs(dir: Path, nodes: Sequence[str], hosts: Sequence[str] = ()) -> DevCerts:
    """A fresh CA in ``dir`` and a certificate per node in ``nodes``, each naming the node,
    localhost, 127.0.0.1, ::1 and ``hosts``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    for n in nodes:
        if not _NAME.match(n):
            raise InvalidArgumentError(f"node name {n!r}: 1-63 letters, digits, '_', '.', '-'")
    if not nodes:
        raise InvalidArgumentError("--nodes: give at least one node name")
    dir.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=VALID_DAYS)

    def pem_key(k: ec.EllipticCurvePrivateKey) -> bytes:
        return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Tandem dev CA (throwaway)")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
               .sign(ca_key, hashes.SHA256()))
    ca_path = dir / "ca.crt"
    _write(ca_path, ca_cert.public_bytes(serialization.Encoding.PEM), secret=False)
    _write(dir / "ca.key", pem_key(ca_key), secret=True)
    out: dict[str, tuple[Path, Path]] = {}
    for name in nodes:
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[str] = []
        for h in (name, "localhost", "127.0.0.1", "::1", *hosts):
            if h not in names:
                names.append(h)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(start).not_valid_after(end)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.SubjectAlternativeName([_san(h) for h in names]), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
        cert_path, key_path = dir / f"{name}.crt", dir / f"{name}.key"
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), secret=False)
        _write(key_path, pem_key(key), secret=True)
        out[name] = (cert_path, key_path)
    return DevCerts(dir=dir, ca=ca_path, nodes=out)


DESCRIPTION = """\
Make a throwaway certificate authority in DIR and a certificate and key per node, for TLS
on one machine or a test network. Each node certificate names the node, localhost,
127.0.0.1, ::1 and the --hosts given. Keys are written with mode 0600. Not for
production: the CA's key is in DIR too.

Use them:
  tandem broker start --name node1 --tls-cert DIR/node1.crt --tls-key DIR/node1.key --tls-ca DIR/ca.crt ...
  tandem status --url 'tandems://admin:PW@127.0.0.1:7780?ca=DIR/ca.crt'
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("certs", help="make certificates for TLS (a throwaway CA for local use)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    csub = p.add_subparsers(dest="certs_command", required=True, metavar="ACTION")
    dev = csub.add_parser("dev", help="a throwaway CA and one certificate and key per node",
                          description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    dev.add_argument("dir", metavar="DIR", help="where to write the files (created if absent; files replaced)")
    dev.add_argument("--nodes", default="node1,node2,node3", metavar="NAME,NAME,...",
                     help="the node names, one certificate each (default node1,node2,node3)")
    dev.add_argument("--hosts", default="", metavar="HOST,HOST,...",
                     help="more host names or addresses every certificate names (besides the node's name, "
                          "localhost, 127.0.0.1 and ::1)")
    dev.set_defaults(func=_dev)


def _dev(args: argparse.Namespace) -> int:
    nodes = [n.strip() for n in args.nodes.split(",") if n.strip()]
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    certs = make_dev_certs(Path(args.dir), nodes, hosts)
    print(f"CA certificate : {certs.ca}  (nodes: --tls-ca; clients: ?ca={certs.ca})")
    for name, (cert, key) in certs.nodes.items():
        print(f"{name:<14} : --tls-cert {cert} --tls-key {key}")
    return 0
