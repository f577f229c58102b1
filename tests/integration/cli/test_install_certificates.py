"""The venv's installer (containers/build/install.sh, every layer of the Makefile) against a package index served
over TLS by a certificate of a CA made here: with the CA in the machine's certificate store alone (no CA-bundle
variable set), uv installs; with the CA named only by pip's own config (as corporate networks do), uv cannot connect
and pip installs instead, saying so in one line. The system store is the CA alone inside a mount namespace of the
test's command (`unshare -m`), so nothing of this machine changes."""

import base64
import hashlib
import http.server
import os
import ssl
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from tests.fakes.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
INSTALL = REPO / "containers" / "build" / "install.sh"
UV = Path(sys.executable).parent / "uv"
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # Debian's store, as OpenSSL and uv's --system-certs read it
Done = subprocess.CompletedProcess
CA_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT", "UV_SYSTEM_CERTS")


def certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate for localhost that it signed: (ca.pem, server.pem, server.key)."""
    folder.mkdir()

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=trainflow test CA",
            "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", "server.key",
            "-out", "server.csr")  # fmt: skip
    (folder / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
            "-extfile", "san.ext", "-out", "server.pem")  # fmt: skip
    return folder / "ca.pem", folder / "server.pem", folder / "server.key"


def wheel(folder: Path, name: str = "tfprobe", version: str = "1.0") -> Path:
    """A pure-Python wheel of one module, with the RECORD its installers check."""
    files = {
        f"{name}.py": "HELLO = 'installed'\n",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = f"{name}-{version}.dist-info/RECORD"
    rows = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        rows.append(f"{path},sha256={digest},{len(text.encode())}")
    files[record] = "\n".join([*rows, f"{record},,"]) + "\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """(the index's URL, the CA): a simple index of one wheel, served over TLS on localhost."""
    root = tmp_path_factory.mktemp("index")
    ca, cert, key = certificates(root / "tls")
    (root / "files").mkdir()
    built = wheel(root / "files")
    digest = hashlib.sha256(built.read_bytes()).hexdigest()
    (root / "simple" / "tfprobe").mkdir(parents=True)
    link = f'<a href="/files/{built.name}#sha256={digest}">{built.name}</a>'
    (root / "simple" / "tfprobe" / "index.html").write_text(f"<html><body>{link}</body></html>\n")
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(root), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://localhost:{server.server_address[1]}/simple/", ca
    server.shutdown()


def install(tmp_path: Path, index_url: str, system_ca: Path | None, **env: str) -> tuple[Done, Path]:
    """install.sh of the probe package into a new venv, with none of the CA variables set; the system store is
    `system_ca` alone where given. Returns the run and the venv's python."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    environ = {k: v for k, v in os.environ.items() if k not in CA_VARIABLES and not k.startswith("PIP_")}
    environ |= {"UV": str(UV), "UV_INDEX_URL": index_url, "PIP_INDEX_URL": index_url, "UV_NO_CACHE": "1"}
    environ |= {"PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_CONFIG_FILE": os.devnull, **env}
    command = f"{INSTALL} {venv}/bin tfprobe"
    if system_ca is not None:  # the CA as the whole system store, in this command's mount namespace only
        command = f"mount --bind {system_ca} {SYSTEM_BUNDLE} && {command}"
    done = subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True, text=True, env=environ)
    return done, venv / "bin" / "python"


def imported(python: Path) -> str:
    return subprocess.run([python, "-c", "import tfprobe; print(tfprobe.HELLO)"], capture_output=True, text=True).stdout


def test_uv_trusts_the_system_store_and_pip_steps_in_where_only_it_can_connect(index, tmp_path):
    url, ca = index
    done, python = install(tmp_path / "system", url, ca)
    assert done.returncode == 0, done.stderr
    assert "installing it with pip instead" not in done.stderr and imported(python) == "installed\n"  # uv did
    config = tmp_path / "pip.conf"  # the CA named only in pip's own config, which uv does not read
    config.write_text(f"[global]\ncert = {ca}\n")
    done, python = install(tmp_path / "pip-only", url, None, PIP_CONFIG_FILE=str(config))
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert "uv could not install that (its error is above); installing it with pip instead" in done.stderr
    assert any("invalid peer certificate" in line or "UnknownIssuer" in line for line in lines), done.stderr
    assert imported(python) == "installed\n"
