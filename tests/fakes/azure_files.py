"""A tiny in-memory Azure Files REST endpoint for tests (Azure Files has no emulator).

It speaks just the operations `infra.storage.azure_files.AzureFileShare` sends through the real SDK
(create directory, directory properties, create file, put range, file properties, download, copy),
path-style like Azurite: http://127.0.0.1:PORT/<account>/<share>/<dir>/<file>. Request formats follow
azure/storage/fileshare/_generated/operations/_operations.py. Every request is checked; what the
client got wrong is appended to `violations` (tests assert it stays empty):

- `x-ms-version` and `x-ms-date` (or `Date`, parseable, within 15 minutes) on every request;
- authentication: a SharedKey `Authorization` header whose HMAC-SHA256 signature is verified with the
  account key (Azure's documented canonicalization), or a SAS query (`sig`, `sv`, `se` in the future,
  `sp` granting the operation; the SAS signature itself is not recomputed);
- directories exist before anything is created in them (404 ParentNotFound otherwise);
- ranges: `x-ms-write: update`, body length equals the range, at most 4 MiB, inside the declared length;
- a copy source is a file of this account, and carries a SAS when the copy request is SAS-authorized.

    with FakeAzureFiles(share="scripts") as fake:
        client = ShareClient(fake.account_url, "scripts", credential=fake.named_key())
"""

import base64
import hashlib
import hmac
import os
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime, formatdate, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

MAX_RANGE = 4 * 1024 * 1024
_SIGNED_HEADERS = [
    "content-encoding",
    "content-language",
    "content-length",
    "content-md5",
    "content-type",
    "date",
    "if-modified-since",
    "if-match",
    "if-none-match",
    "if-unmodified-since",
    "range",
]


class AzureError(Exception):
    """An error response the way Azure sends it: status, x-ms-error-code and an XML body."""

    def __init__(self, status: int, code: str, message: str, violation: bool = False):
        super().__init__(message)
        self.status, self.code, self.message, self.violation = status, code, message, violation


@dataclass
class StoredFile:
    """One file's bytes and its copy state."""

    data: bytearray
    etag: str = field(default_factory=lambda: f'"0x{uuid.uuid4().hex[:15].upper()}"')
    copy: dict = field(default_factory=dict)


class FakeAzureFiles:
    """The fake service: shares, directories and files in memory, plus the recorded violations."""

    def __init__(self, account: str = "devstoreaccount1", share: str = "scripts"):
        self.account = account
        self.key = base64.b64encode(os.urandom(64)).decode()
        self.shares = {share}
        self.dirs: set[str] = set()  # "share/dir/sub"
        self.files: dict[str, StoredFile] = {}  # "share/dir/file"
        self.violations: list[str] = []
        self.requests: list[tuple[str, str, str]] = []  # (method, path, operation)
        self.copy_outcome = "success"  # or "pending" / "failed": what the next copies report
        self.pending_polls = 0  # for "pending": how many property reads still say pending
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None

    # -- life cycle -------------------------------------------------------------------------------
    def start(self) -> "FakeAzureFiles":
        """Listen on a free loopback port in a background thread."""
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-azure-files", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening."""
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "FakeAzureFiles":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def account_url(self) -> str:
        """http://127.0.0.1:PORT/<account>, what ShareClient takes as account_url."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/{self.account}"

    def account_key_dict(self) -> dict:
        """The account-key credential as the SDK's dict form."""
        return {"account_name": self.account, "account_key": self.key}

    def named_key(self):
        """The account-key credential as an AzureNamedKeyCredential."""
        from azure.core.credentials import AzureNamedKeyCredential

        return AzureNamedKeyCredential(self.account, self.key)

    def note(self, message: str) -> None:
        """Record a violation."""
        with self._lock:
            self.violations.append(message)

    # -- checks -----------------------------------------------------------------------------------
    def check_common(self, req: "_Request") -> None:
        if not req.header("x-ms-version"):
            self.note(f"{req.describe()}: no x-ms-version header")
        stamp = req.header("x-ms-date") or req.header("date")
        if not stamp:
            self.note(f"{req.describe()}: neither x-ms-date nor Date header")
            return
        try:
            age = abs(datetime.now(UTC) - parsedate_to_datetime(stamp))
        except (TypeError, ValueError):
            self.note(f"{req.describe()}: unparseable date {stamp!r}")
            return
        if age > timedelta(minutes=15):
            raise AzureError(403, "AuthenticationFailed", "Request date is more than 15 minutes off.", True)

    def authenticate(self, req: "_Request", needs: str) -> str:
        """Return "sas" or "sharedkey", or raise the error Azure would send."""
        auth = req.header("authorization")
        if auth:
            self._check_shared_key(req, auth)
            return "sharedkey"
        if "sig" in req.query:
            self._check_sas(req, needs)
            return "sas"
        raise AzureError(401, "NoAuthenticationInformation", "Server failed to authenticate the request.", True)

    def _check_shared_key(self, req: "_Request", auth: str) -> None:
        scheme, _, rest = auth.partition(" ")
        account, _, signature = rest.partition(":")
        if scheme != "SharedKey" or account != self.account or not signature:
            raise AzureError(403, "AuthenticationFailed", f"Malformed Authorization header {auth[:40]!r}.", True)
        expected = base64.b64encode(
            hmac.new(base64.b64decode(self.key), req.string_to_sign(self.account).encode(), hashlib.sha256).digest()
        ).decode()
        if not hmac.compare_digest(expected, signature):
            raise AzureError(403, "AuthenticationFailed", "The MAC signature found in the request is not valid.", True)

    def _check_sas(self, req: "_Request", needs: str) -> None:
        q = req.query
        missing = [k for k in ("sv", "se", "sp") if not q.get(k)]
        if missing:
            raise AzureError(403, "AuthenticationFailed", f"SAS lacks {', '.join(missing)}.", True)
        if datetime.fromisoformat(q["se"].replace("Z", "+00:00")) < datetime.now(UTC):
            raise AzureError(403, "AuthenticationFailed", "Signed expiry time has passed.", True)
        if not any(p in q["sp"] for p in needs):
            raise AzureError(403, "AuthorizationPermissionMismatch", f"SAS sp={q['sp']} lacks {needs!r}.", True)

    # -- operations -------------------------------------------------------------------------------
    def parent_exists(self, key: str) -> bool:
        parent = key.rsplit("/", 1)[0]
        return "/" not in parent or parent in self.dirs

    def create_directory(self, key: str) -> dict:
        if not self.parent_exists(key):
            raise AzureError(404, "ParentNotFound", "The specified parent path does not exist.", True)
        if key in self.dirs or key in self.files:
            raise AzureError(409, "ResourceAlreadyExists", "The specified resource already exists.")
        self.dirs.add(key)
        return {"ETag": f'"0x{uuid.uuid4().hex[:15].upper()}"'}

    def create_file(self, key: str, req: "_Request") -> dict:
        if req.header("x-ms-type") != "file":
            self.note(f"{req.describe()}: x-ms-type is {req.header('x-ms-type')!r}, not 'file'")
        try:
            length = int(req.header("x-ms-content-length"))
        except (TypeError, ValueError):
            raise AzureError(400, "MissingRequiredHeader", "x-ms-content-length is required.", True) from None
        if not self.parent_exists(key):
            raise AzureError(404, "ParentNotFound", "The specified parent path does not exist.", True)
        if key in self.dirs:
            raise AzureError(409, "ResourceAlreadyExists", "A directory exists at this path.")
        stored = self.files[key] = StoredFile(bytearray(length))
        return {"ETag": stored.etag}

    def put_range(self, key: str, req: "_Request") -> dict:
        stored = self.files.get(key)
        if stored is None:
            raise AzureError(404, "ResourceNotFound", "The specified resource does not exist.", True)
        if req.header("x-ms-write") != "update":
            raise AzureError(400, "InvalidHeaderValue", "Only x-ms-write: update is supported here.", True)
        start, end = _parse_range(req.header("x-ms-range") or req.header("range"))
        if end is None or len(req.body) != end - start + 1:
            raise AzureError(400, "InvalidHeaderValue", "Body length does not match the range.", True)
        if end - start + 1 > MAX_RANGE:
            raise AzureError(413, "RequestBodyTooLarge", "A range is at most 4 MiB.", True)
        if end >= len(stored.data):
            raise AzureError(416, "InvalidRange", f"Range ends at {end}, the file has {len(stored.data)} bytes.", True)
        stored.data[start : end + 1] = req.body
        stored.etag = f'"0x{uuid.uuid4().hex[:15].upper()}"'
        return {"ETag": stored.etag, "x-ms-request-server-encrypted": "true"}

    def copy(self, key: str, req: "_Request", auth: str) -> dict:
        source = urlsplit(req.header("x-ms-copy-source"))
        segments = [unquote(s) for s in source.path.split("/")[1:]]
        if source.netloc != req.host or segments[:1] != [self.account] or len(segments) < 3:
            raise AzureError(400, "CannotVerifyCopySource", "Only same-account copies are served here.", True)
        if auth == "sas" and "sig=" not in source.query:
            raise AzureError(403, "CannotVerifyCopySource", "A SAS-authorized copy needs a SAS on its source.", True)
        src = self.files.get("/".join(segments[1:]))
        if src is None:
            raise AzureError(404, "CannotVerifyCopySource", "The specified resource does not exist.")
        if not self.parent_exists(key):
            raise AzureError(404, "ParentNotFound", "The specified parent path does not exist.", True)
        copy = {
            "x-ms-copy-id": str(uuid.uuid4()),
            "x-ms-copy-status": self.copy_outcome,
            "x-ms-copy-source": req.header("x-ms-copy-source"),
        }
        data = src.data if self.copy_outcome != "failed" else bytearray()
        self.files[key] = StoredFile(bytearray(data), copy=copy)
        if self.copy_outcome == "failed":
            copy["x-ms-copy-status-description"] = "500 InternalError Copy failed (fake)."
        return {
            "ETag": self.files[key].etag,
            "x-ms-copy-id": copy["x-ms-copy-id"],
            "x-ms-copy-status": copy["x-ms-copy-status"],
        }

    def file_headers(self, key: str) -> dict:
        stored = self.files.get(key)
        if stored is None:
            raise AzureError(404, "ResourceNotFound", "The specified resource does not exist.")
        copy = dict(stored.copy)
        if copy.get("x-ms-copy-status") == "pending":
            if self.pending_polls > 0:
                self.pending_polls -= 1
            else:
                copy["x-ms-copy-status"] = stored.copy["x-ms-copy-status"] = "success"
        return {
            "ETag": stored.etag,
            "x-ms-type": "File",
            "Content-Type": "application/octet-stream",
            "x-ms-file-attributes": "Archive",
            **copy,
        }


@dataclass
class _Request:
    method: str
    raw_path: str
    raw_query: str
    headers: dict  # lower-case name -> value
    body: bytes
    host: str

    @property
    def query(self) -> dict:
        pairs = (p.partition("=") for p in self.raw_query.split("&") if p)
        return {unquote(k).lower(): unquote(v) for k, _, v in pairs}

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def describe(self) -> str:
        return f"{self.method} {self.raw_path}{'?' + self.raw_query if self.raw_query else ''}"

    def string_to_sign(self, account: str) -> str:
        """Azure's SharedKey string-to-sign for this request (version 2009-09-19 and later)."""
        values = dict(self.headers)
        if values.get("content-length") == "0":
            values.pop("content-length")
        lines = [self.method] + [values.get(h, "") for h in _SIGNED_HEADERS]
        ms = sorted((k, v) for k, v in self.headers.items() if k.startswith("x-ms-"))
        resource = f"/{account}{self.raw_path}" + "".join(f"\n{k}:{v}" for k, v in sorted(self.query.items()))
        return "\n".join(lines) + "\n" + "".join(f"{k}:{v}\n" for k, v in ms) + resource


def _parse_range(value: str | None) -> tuple[int, int | None]:
    if not value or not value.startswith("bytes="):
        raise AzureError(400, "InvalidHeaderValue", f"Bad range {value!r}.", True)
    start, _, end = value[len("bytes=") :].partition("-")
    return int(start), (int(end) if end else None)


def _error_body(code: str, message: str) -> bytes:
    when = formatdate(usegmt=True)
    text = f"{message}\nRequestId:{uuid.uuid4()}\nTime:{when}"
    return f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>{text}</Message></Error>'.encode()


def _handler_for(fake: FakeAzureFiles):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # keep test output quiet
            pass

        def do_GET(self) -> None:
            self._serve()

        def do_HEAD(self) -> None:
            self._serve()

        def do_PUT(self) -> None:
            self._serve()

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            parts = urlsplit(self.path)
            headers = {k.lower(): v.strip() for k, v in self.headers.items()}
            req = _Request(self.command, parts.path, parts.query, headers, body, self.headers.get("Host", ""))
            try:
                status, out_headers, out_body = _dispatch(fake, req)
            except AzureError as err:
                if err.violation:
                    fake.note(f"{req.describe()}: {err.status} {err.code}: {err.message}")
                status, out_body = err.status, _error_body(err.code, err.message)
                out_headers = {"x-ms-error-code": err.code, "Content-Type": "application/xml"}
            self._reply(status, out_headers, out_body)

        def _reply(self, status: int, headers: dict, body: bytes) -> None:
            self.send_response(status)
            base = {
                "x-ms-request-id": str(uuid.uuid4()),
                "x-ms-version": "2026-10-06",
                "Last-Modified": format_datetime(datetime.now(UTC), usegmt=True),
            }
            for name, value in {**base, **headers}.items():
                self.send_header(name, value)
            if "Content-Length" not in headers:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

    return Handler


def _dispatch(fake: FakeAzureFiles, req: _Request) -> tuple[int, dict, bytes]:
    segments = [unquote(s) for s in req.raw_path.split("/")[1:]]
    op = _operation(req)
    with fake._lock:
        fake.requests.append((req.method, req.raw_path, op))
    fake.check_common(req)
    auth = fake.authenticate(req, "r" if req.method in ("GET", "HEAD") else "cw")
    if segments[:1] != [fake.account] or len(segments) < 2:
        raise AzureError(400, "InvalidUri", f"Expected /{fake.account}/<share>/..., got {req.raw_path}.", True)
    if segments[1] not in fake.shares:
        raise AzureError(404, "ShareNotFound", "The specified share does not exist.")
    key = "/".join(s for s in segments[1:] if s)
    with fake._lock:
        return _run(fake, op, key, req, auth)


def _operation(req: _Request) -> str:
    q = req.query
    if q.get("restype") not in (None, "directory"):
        return "unsupported"
    if q.get("restype") == "directory":
        return {"PUT": "create_directory"}.get(req.method, "directory_properties")
    if req.method == "PUT" and q.get("comp") == "range":
        return "put_range"
    if req.method == "PUT" and req.header("x-ms-copy-source"):
        return "copy"
    if req.method == "PUT" and not q.get("comp"):
        return "create_file"
    return {"HEAD": "file_properties", "GET": "download"}.get(req.method if not q.get("comp") else "", "unsupported")


def _run(fake: FakeAzureFiles, op: str, key: str, req: _Request, auth: str) -> tuple[int, dict, bytes]:
    if op == "create_directory":
        return 201, fake.create_directory(key), b""
    if op == "directory_properties":
        if key not in fake.dirs and "/" in key:
            raise AzureError(404, "ResourceNotFound", "The specified resource does not exist.")
        return 200, {"ETag": '"0x1"'}, b""
    if op == "create_file":
        return 201, fake.create_file(key, req), b""
    if op == "put_range":
        return 201, fake.put_range(key, req), b""
    if op == "copy":
        return 202, fake.copy(key, req, auth), b""
    if op == "file_properties":
        headers = fake.file_headers(key)
        return 200, {**headers, "Content-Length": str(len(fake.files[key].data))}, b""
    if op == "download":
        return _download(fake, key, req)
    raise AzureError(400, "UnsupportedHttpVerb", f"The fake does not serve {req.describe()}.", True)


def _download(fake: FakeAzureFiles, key: str, req: _Request) -> tuple[int, dict, bytes]:
    headers = fake.file_headers(key)
    data = bytes(fake.files[key].data)
    wanted = req.header("x-ms-range") or req.header("range")
    if not wanted:
        return 200, headers, data
    start, end = _parse_range(wanted)
    if start >= len(data):
        raise AzureError(416, "InvalidRange", "The range specified is invalid for the current size of the resource.")
    end = min(len(data) - 1, len(data) - 1 if end is None else end)
    headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
    return 206, headers, data[start : end + 1]
