"""Test certificates: a CA, a server certificate for 127.0.0.1 and a client
certificate (for the TLS and mutual-TLS servers of several test modules), and
the Python client's TLS arguments for them."""

from __future__ import annotations

import datetime
from pathlib import Path


def make_certs(tmp: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def make(name, issuer_key=None, issuer_name=None, ca=False, san=None):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        b = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer_name or subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        cert = b.sign(issuer_key or key, hashes.SHA256())
        return key, cert

    ca_key, ca = make("test-ca", ca=True)
    srv_key, srv = make(
        "server", ca_key, ca.subject, san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    cli_key, cli = make("client", ca_key, ca.subject)
    out = {}
    for name, obj in {"ca": ca, "server": srv, "client": cli}.items():
        out[name] = tmp / f"{name}.pem"
        out[name].write_bytes(obj.public_bytes(serialization.Encoding.PEM))
    for name, key in {"server_key": srv_key, "client_key": cli_key}.items():
        out[name] = tmp / f"{name}.pem"
        out[name].write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return out


def python_tls(certs: dict[str, Path]) -> dict[str, bytes]:
    """RolloutClient's keyword arguments for mutual TLS with `certs`."""
    return dict(
        root_certificates=certs["ca"].read_bytes(),
        certificate_chain=certs["client"].read_bytes(),
        private_key=certs["client_key"].read_bytes(),
    )


def server_tls_args(certs: dict[str, Path]) -> list[str]:
    """`rollout-service serve` flags for mutual TLS with `certs`."""
    return [
        "--tls-cert", str(certs["server"]),
        "--tls-key", str(certs["server_key"]),
        "--tls-client-ca", str(certs["ca"]),
    ]  # fmt: skip
