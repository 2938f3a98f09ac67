"""Response verification for compare.py: a server is measured only after it answered correctly.

Every check talks raw HTTP/1.1 over a socket (TCP or Unix), so it sees exactly what a load
generator sees. For each path it sends one GET and checks:
  - status 200 (404 means "this build does not serve the path": the scenario is skipped as
    unsupported, not failed);
  - a non-empty Server header, and a Date header in RFC 1123 form, in GMT, within a few seconds of
    this machine's clock;
  - Content-Type of the expected kind;
  - Content-Length present and equal to the body's length (for the app endpoints other than /text,
    chunked encoding is accepted instead: TechEmpower's rule is "one of the two length headers");
  - the body: exact bytes for /plaintext, /json and /text (the sample's alphabet); well-formed JSON,
    XML or HTML for the other app endpoints.
The first path is also sent three times in one write (pipelining: three complete answers in order)
and once with "Connection: close" (the server answers, then closes).

An https:// target gets the same checks over TLS (ALPN http/1.1; the server's certificate is not verified:
benchmark servers make a self-signed one at start).

Usable as a module (compare.py) or from the command line:
    python3 verify.py 127.0.0.1:8080 /plaintext /json
    python3 verify.py https://127.0.0.1:8443 /json
    python3 verify.py unix:/tmp/kestrel.sock /plaintext
"""

from __future__ import annotations

import email.utils
import json
import socket
import ssl
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from datetime import datetime, timezone

HELLO = b"Hello, World!"
JSON_HELLO = b'{"message":"Hello, World!"}'
# samples/TechEmpower/Scenarios/ScenariosController.cs, Alphabet
ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
DATE_TOLERANCE_S = 5.0


@dataclass
class Response:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    chunked: bool = False

    def header(self, name: str) -> str | None:
        values = self.headers_named(name)
        return values[0] if values else None

    def headers_named(self, name: str) -> list[str]:
        lower = name.lower()
        return [v for k, v in self.headers if k.lower() == lower]


@dataclass
class Expectation:
    content_types: tuple[str, ...]      # accepted media types (parameters such as charset ignored)
    body: bytes | None = None           # exact body, when the test defines one
    body_kind: str | None = None        # "json", "xml", "html" or "any": well-formed and non-empty
    require_content_length: bool = True


def _download_body(kib: int) -> bytes:
    """The body of the sample's GET /download/{kib}: kib KiB in which byte i is i % 251."""
    n = kib * 1024
    return (bytes(range(251)) * (n // 251 + 1))[:n]


# What each endpoint must answer. /text's body is the sample's fixed alphabet; the other app
# endpoints produce documents with per-request content (GUIDs, times), so only their form is checked.
EXPECTATIONS: dict[str, Expectation] = {
    "/plaintext": Expectation(("text/plain",), body=HELLO),
    "/json": Expectation(("application/json",), body=JSON_HELLO),
    "/text": Expectation(("text/plain",), body=ALPHABET),
    "/json-object": Expectation(("application/json",), body_kind="json", require_content_length=False),
    "/xml": Expectation(("application/xml", "text/xml"), body_kind="xml", require_content_length=False),
    "/html": Expectation(("text/html",), body_kind="html", require_content_length=False),
    "/api/test": Expectation(("application/json", "text/plain"), body_kind="any", require_content_length=False),
    # The sample's large responses: byte i is i % 251 (ScenariosController.Download).
    "/download/256": Expectation(("application/octet-stream",), body=_download_body(256)),
    "/download/8192": Expectation(("application/octet-stream",), body=_download_body(8192)),
    # The awaiting handler answers the body its downstream call got: the C ceiling server's /json.
    "/await": Expectation(("application/json", "text/plain"), body=JSON_HELLO, require_content_length=False),
}


@dataclass
class Target:
    """Where a server listens: ("tcp", host, port), over TLS with tls, or ("unix", path)."""

    kind: str
    host: str = ""
    port: int = 0
    path: str = ""
    tls: bool = False

    @staticmethod
    def parse(text: str) -> "Target":
        if text.startswith("unix:"):
            return Target("unix", path=text[5:])
        tls = text.startswith("https://")
        host, _, port = text.removeprefix("https://").removeprefix("http://").rpartition(":")
        return Target("tcp", host=host.strip("[]"), port=int(port), tls=tls)

    def host_header(self) -> str:
        return "localhost" if self.kind == "unix" else f"{self.host}:{self.port}"

    def __str__(self) -> str:
        if self.kind == "unix":
            return f"unix:{self.path}"
        return f"https://{self.host}:{self.port}" if self.tls else f"{self.host}:{self.port}"


class ProtocolError(Exception):
    pass


def connect(target: Target, timeout: float) -> socket.socket:
    if target.kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address: object = target.path
    else:
        family = socket.AF_INET6 if ":" in target.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        address = (target.host, target.port)
    sock.settimeout(timeout)
    try:
        sock.connect(address)
        if target.tls:
            sock = _TLS.wrap_socket(sock)     # the handshake, within the same timeout
    except OSError:
        sock.close()
        raise
    return sock


def _client_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["http/1.1"])
    return context


_TLS = _client_context()


def request_bytes(target: Target, path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {target.host_header()}\r\n{extra}\r\n".encode("ascii")


class _Reader:
    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buf = bytearray()          # appended in place: an 8 MiB body is 128 reads
        self.eof = False

    def _fill(self) -> None:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise ProtocolError("timed out waiting for the response")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except socket.timeout as exc:
            raise ProtocolError("timed out waiting for the response") from exc
        if not data:
            self.eof = True
        self.buf += data

    def until(self, marker: bytes) -> bytes:
        while marker not in self.buf:
            if self.eof:
                raise ProtocolError("connection closed in the middle of a response")
            self._fill()
        head, _, rest = self.buf.partition(marker)
        self.buf = bytearray(rest)
        return bytes(head)

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            if self.eof:
                raise ProtocolError("connection closed in the middle of a body")
            self._fill()
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def to_eof(self) -> bytes:
        while not self.eof:
            self._fill()
        data, self.buf = bytes(self.buf), bytearray()
        return data

    def closed_soon(self) -> bool:
        try:
            while not self.eof:
                self._fill()
        except (ProtocolError, ConnectionResetError):
            return False
        return True


def _read_response(reader: _Reader) -> Response:
    head = reader.until(b"\r\n\r\n").decode("latin-1")
    lines = head.split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"malformed status line {lines[0]!r}")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ProtocolError(f"malformed header line {line!r}")
        headers.append((name, value.strip()))
    response = Response(int(parts[1]), parts[2] if len(parts) > 2 else "", headers, b"")
    lengths = set(response.headers_named("Content-Length"))
    encoding = (response.header("Transfer-Encoding") or "").lower()
    if "chunked" in encoding:
        response.chunked = True
        body = bytearray()
        while True:
            size_line = reader.until(b"\r\n").split(b";")[0].strip()
            size = int(size_line, 16)
            if size == 0:
                reader.until(b"\r\n")   # no trailers expected
                break
            body += reader.exactly(size)
            reader.exactly(2)
        response.body = bytes(body)
    elif lengths:
        if len(lengths) > 1:
            raise ProtocolError(f"conflicting Content-Length headers {sorted(lengths)}")
        response.body = reader.exactly(int(lengths.pop()))
    elif response.status in (204, 304) or 100 <= response.status < 200:
        response.body = b""
    else:
        response.body = reader.to_eof()
    return response


def exchange(target: Target, payload: bytes, count: int, timeout: float = 5.0,
             expect_close: bool = False) -> tuple[list[Response], bool]:
    """Sends payload, reads `count` responses; with expect_close also whether the server closed."""
    deadline = time.monotonic() + timeout
    sock = connect(target, timeout)
    try:
        sock.sendall(payload)
        reader = _Reader(sock, deadline)
        responses = [_read_response(reader) for _ in range(count)]
        closed = False
        if expect_close:
            reader.deadline = min(deadline, time.monotonic() + 2.0)
            closed = reader.closed_soon()
        return responses, closed
    finally:
        sock.close()


def exchange_on(sock: socket.socket, payload: bytes, timeout: float = 5.0) -> Response:
    """Sends one request on an open keep-alive connection and reads its response (nothing else may be in
    flight on it)."""
    sock.sendall(payload)
    return _read_response(_Reader(sock, time.monotonic() + timeout))


def _media_type(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


def check_response(path: str, response: Response) -> tuple[str, str]:
    """Returns ("ok" | "missing" | "bad", reason)."""
    if response.status == 404:
        return "missing", f"{path} answered 404 (not served by this build)"
    if response.status != 200:
        return "bad", f"{path} answered {response.status} {response.reason}"
    expect = EXPECTATIONS.get(path, Expectation((), body_kind="any", require_content_length=False))
    problems = []
    if not (response.header("Server") or "").strip():
        problems.append("no Server header")
    date = response.header("Date")
    if not date:
        problems.append("no Date header")
    else:
        try:
            parsed = email.utils.parsedate_to_datetime(date)
            if not date.endswith(" GMT"):
                raise ValueError("not GMT")
            skew = abs((datetime.now(timezone.utc) - parsed).total_seconds())
            if skew > DATE_TOLERANCE_S:
                problems.append(f"Date {date!r} is {skew:.0f} s away from this machine's clock")
        except (TypeError, ValueError):
            problems.append(f"malformed Date {date!r}")
    content_type = response.header("Content-Type")
    if not content_type:
        problems.append("no Content-Type header")
    elif expect.content_types and _media_type(content_type) not in expect.content_types:
        problems.append(f"Content-Type {content_type!r}, expected {' or '.join(expect.content_types)}")
    length = response.header("Content-Length")
    if length is None and (expect.require_content_length or not response.chunked):
        problems.append("no Content-Length header")
    if expect.body is not None and response.body != expect.body:
        problems.append(f"body {response.body[:80]!r}, expected {expect.body!r}")
    if expect.body_kind and not response.body.strip():
        problems.append("empty body")
    elif expect.body_kind == "json":
        try:
            json.loads(response.body)
        except ValueError as exc:
            problems.append(f"body is not JSON ({exc})")
    elif expect.body_kind == "xml":
        try:
            ElementTree.fromstring(response.body)
        except ElementTree.ParseError as exc:
            problems.append(f"body is not well-formed XML ({exc})")
    elif expect.body_kind == "html" and b"<" not in response.body:
        problems.append("body is not HTML")
    if problems:
        return "bad", f"{path}: " + "; ".join(problems)
    return "ok", ""


@dataclass
class Verification:
    paths: dict[str, tuple[str, str]] = field(default_factory=dict)   # path -> (state, reason)
    problems: list[str] = field(default_factory=list)                # connection-level failures

    @property
    def failed(self) -> bool:
        return bool(self.problems) or any(state == "bad" for state, _ in self.paths.values())

    def reasons(self) -> list[str]:
        return self.problems + [reason for state, reason in self.paths.values() if state == "bad"]

    def state(self, path: str) -> tuple[str, str]:
        return self.paths.get(path, ("bad", f"{path} was not verified"))


def verify(target: Target, paths: list[str], deep: bool = True) -> Verification:
    """Checks every path once; with deep, also pipelining and Connection: close on the first one."""
    result = Verification()
    for path in paths:
        try:
            (response,), _ = exchange(target, request_bytes(target, path), 1)
            result.paths[path] = check_response(path, response)
        except (OSError, ProtocolError, ValueError) as exc:
            result.paths[path] = ("bad", f"{path}: {exc}")
    first = paths[0]
    if not deep or result.paths[first][0] != "ok":
        return result
    try:
        responses, _ = exchange(target, request_bytes(target, first) * 3, 3)
        for i, response in enumerate(responses):
            state, reason = check_response(first, response)
            if state != "ok":
                result.problems.append(f"pipelined request {i + 1} of 3: {reason}")
                break
    except (OSError, ProtocolError, ValueError) as exc:
        result.problems.append(f"3 pipelined requests for {first}: {exc}")
    try:
        (response,), closed = exchange(target, request_bytes(target, first, "Connection: close\r\n"), 1,
                                       expect_close=True)
        state, reason = check_response(first, response)
        if state != "ok":
            result.problems.append(f"with Connection: close: {reason}")
        elif not closed:
            result.problems.append(f"{first} with Connection: close: the server kept the connection open")
    except (OSError, ProtocolError, ValueError) as exc:
        result.problems.append(f"{first} with Connection: close: {exc}")
    return result


def answers(target: Target, path: str, timeout: float = 1.0) -> bool:
    """True when the server returns any HTTP response for path (used to wait for startup)."""
    try:
        exchange(target, request_bytes(target, path), 1, timeout=timeout)
        return True
    except (OSError, ProtocolError, ValueError):
        return False


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 2
    target = Target.parse(argv[1])
    result = verify(target, argv[2:])
    for path, (state, reason) in result.paths.items():
        print(f"{state:8} {path}  {reason}")
    for problem in result.problems:
        print(f"bad      {problem}")
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
