"""det's certificate authority and the embedded server's TLS certificate.

``det cluster up --listen HOST:PORT`` makes the embedded PostgreSQL accept TCP connections, with
TLS only. Clients on other hosts verify the server (``sslmode=verify-full``) against det's own
CA: a self-signed CA certificate made once per det home (10 years), which signs the server's
certificate (2 years, made again when a name it must carry is missing). The CA's key stays in
``<det home>/tls`` (0600) and signs nothing but server certificates; what another host needs is
the CA's certificate alone (``det cluster ca`` prints it).
"""

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CA_DAYS = 3650
SERVER_DAYS = 730


def tls_dir(home: Path) -> Path:
    return home / "tls"


def ca_cert_path(home: Path) -> Path:
    """The CA certificate clients verify the server with (``sslrootcert=``)."""
    return tls_dir(home) / "ca.crt"


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    path.chmod(mode)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "det"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def ensure_ca(home: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """det's CA of ``home``: read, or made once (key 0600, certificate 0644)."""
    d = tls_dir(home)
    d.mkdir(mode=0o700, exist_ok=True)
    key_path, cert_path = d / "ca.key", ca_cert_path(home)
    if key_path.exists() and cert_path.exists():
        return (x509.load_pem_x509_certificate(cert_path.read_bytes()),
                serialization.load_pem_private_key(key_path.read_bytes(), None))
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name("det CA")).issuer_name(_name("det CA"))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    _write(key_path, _key_pem(key), 0o600)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert, key


def subject_names(names: list[str]) -> list[x509.GeneralName]:
    """The certificate's subject alternative names for host names and IP addresses."""
    out: list[x509.GeneralName] = []
    for n in dict.fromkeys(names):
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            out.append(x509.DNSName(n))
    return out


def _covers(cert_path: Path, names: list[str], ca: x509.Certificate) -> bool:
    """Whether the certificate at ``cert_path`` is signed by ``ca``, valid for 30 days more,
    and names every one of ``names``."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=30)
    return (cert.issuer == ca.subject and cert.not_valid_after_utc > soon
            and all(n in list(sans) for n in subject_names(names)))


def ensure_server_cert(home: Path, out_dir: Path, names: list[str]) -> tuple[Path, Path]:
    """The server's certificate and key in ``out_dir`` (``server.crt``, ``server.key`` 0600),
    signed by det's CA of ``home`` (made if missing) for ``names`` (host names and IP
    addresses, the first the common name); kept while they still cover ``names``.

    Raises:
        ValueError: ``names`` is empty.
        OSError: the files could not be written.
    """
    if not names:
        raise ValueError("a server certificate needs at least one host name or address")
    ca, ca_key = ensure_ca(home)
    cert_path, key_path = out_dir / "server.crt", out_dir / "server.key"
    if key_path.exists() and _covers(cert_path, names, ca):
        return cert_path, key_path
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(names[0])).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=SERVER_DAYS))
            .add_extension(x509.SubjectAlternativeName(subject_names(names)), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write(key_path, _key_pem(key), 0o600)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert_path, key_path
