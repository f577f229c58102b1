"""An identity for Azurite's basic OAuth (a token credential whose JWTs pass its issuer, audience and lifetime
checks) and the self-signed certificate Azurite serves HTTPS with. The fixture oauth_azurite, Azurite over
HTTPS with basic OAuth, is in tests/integration/conftest.py."""

import base64
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime, timedelta
from ipaddress import ip_address
from pathlib import Path

from azure.core.credentials import AccessToken
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

OID, TID = "5f1c0a4e-0000-4000-8000-00000000000a", "72f988bf-0000-4000-8000-00000000000b"


def b64url(data: bytes) -> str:
    """Base64url without padding, as JWTs write it."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Identity:
    """A token credential whose JWTs pass Azurite's basic OAuth check (issuer, audience, lifetime)."""

    def __init__(self, audience: str = "https://storage.azure.com"):
        self.audience = audience

    def get_token(self, *scopes, **kwargs) -> AccessToken:
        now = int(time.time())
        claims = {
            "aud": self.audience,
            "iss": f"https://sts.windows.net/{TID}/",
            "iat": now - 60,
            "nbf": now - 60,
            "exp": now + 3600,
            "oid": OID,
            "tid": TID,
        }
        header = json.dumps({"alg": "HS256", "typ": "JWT"}).encode()
        unsigned = f"{b64url(header)}.{b64url(json.dumps(claims).encode())}"
        signature = b64url(hmac.new(b"test-only", unsigned.encode(), hashlib.sha256).digest())
        return AccessToken(f"{unsigned}.{signature}", now + 3600)


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return folder / "cert.pem", folder / "key.pem"
