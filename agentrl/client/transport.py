"""KeepAliveTransport: a lean HTTP/1.1 keep-alive transport for httpx, for many small JSON calls.

What it is: an ``httpx.AsyncBaseTransport`` that keeps a free list of open connections per
host and speaks plain HTTP/1.1 over asyncio streams — one request, then one response whose
body has a ``Content-Length``, is chunked, or runs to the end of the connection. It exists
for ``RemoteEngine``'s hot path (a ``/generate`` call per model turn, tens in flight): httpx's
default transport (httpcore) walks every pooled connection and polls each one's socket on
every request, a CPU cost that grows with the calls in flight (``benchmarks/gateway.py``
measures it); ``RemoteEngine`` uses it unless given another transport.
``post_json(Origin.of(base_url), path, body)`` is the same exchange without httpx's request
and response objects (status and body back): ``RemoteEngine``'s ``/generate`` calls go that
way, skipping the cost of building and reading those objects.

How it behaves: a pooled connection that the server closed while idle is noticed before use
(or, when the close arrives while the request is written, the request is sent once more on a
fresh connection: nothing of it was read, so this is safe for any method). Timeouts come from
the request (httpx's ``connect``/``read``/``write``); failures raise httpx's own exceptions
(``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``, ``ReadError``, ``WriteError``,
``RemoteProtocolError``), so callers' retry rules are unchanged.

What it is not: TLS, HTTP/2, proxies, ``Expect: 100-continue``, or a streaming reader — the
whole body is read before the response is returned (use httpx's default transport to
stream). Content is asked for uncompressed (``Accept-Encoding: identity``).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import httpx

_MAX_HEAD = 64 * 1024


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @property
    def usable(self) -> bool:
        return not (self.reader.at_eof() or self.writer.is_closing())

    def close(self) -> None:
        self.writer.close()


class KeepAliveTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 with keep-alive for ``http://`` URLs; see the module docstring."""

    def __init__(self, *, max_idle_per_host: int = 256) -> None:
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[tuple[str, int], list[_Connection]] = defaultdict(list)
        self.connections_opened = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"KeepAliveTransport speaks plain http://, not {url.scheme}://",
                                            request=request)
        timeout = request.extensions.get("timeout") or {}
        payload = _head(request) + await request.aread()
        status, headers, body = await self._roundtrip((url.host, url.port or 80), payload, timeout, request)
        return httpx.Response(status, headers=headers, content=body, request=request,
                              extensions={"http_version": b"HTTP/1.1"})

    async def post_json(self, origin: Origin, path: str, body: bytes, *, read_timeout: float | None,
                        connect_timeout: float | None = 5.0, headers: bytes = b"") -> tuple[int, bytes]:
        """``POST`` of a JSON ``body`` without httpx's request and response objects: the answer's
        status and body. ``origin`` comes from ``Origin.of(base_url)``; ``headers`` are extra
        ``b"Name: value\r\n"`` lines. For a caller that sends many small calls (``RemoteEngine``'s
        ``/generate``): building and reading httpx's objects cost as much as the exchange."""
        payload = b"".join((b"POST ", origin.prefix, path.encode(), b" HTTP/1.1\r\nHost: ", origin.host_header,
                            b"\r\nContent-Type: application/json\r\nAccept-Encoding: identity\r\n", headers,
                            b"Content-Length: ", str(len(body)).encode(), b"\r\n\r\n", body))
        timeout = {"connect": connect_timeout, "read": read_timeout, "write": read_timeout}
        status, _, content = await self._roundtrip(origin.key, payload, timeout, None)
        return status, content

    async def _roundtrip(self, key: tuple[str, int], payload: bytes, limits: dict, request: httpx.Request | None
                         ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        for attempt in (0, 1):
            conn, reused = self._take(key), True
            if conn is None:
                conn, reused = await self._connect(key, limits.get("connect"), request), False
            try:
                status, headers, body, keep = await self._exchange(conn, payload, limits, request)
            except _Stale:
                conn.close()
                if reused and attempt == 0:
                    continue  # the server had closed this idle connection: nothing was read, send again
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.",
                                                request=request) from None
            except BaseException:
                conn.close()
                raise
            if keep and len(self._idle[key]) < self.max_idle_per_host:
                self._idle[key].append(conn)
            else:
                conn.close()
            return status, headers, body
        raise AssertionError("unreachable")

    def _take(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle[key]
        while idle:
            conn = idle.pop()
            if conn.usable:
                return conn
            conn.close()
        return None

    async def _connect(self, key: tuple[str, int], seconds: float | None, request: httpx.Request | None) -> _Connection:
        try:
            async with asyncio.timeout(seconds):
                reader, writer = await asyncio.open_connection(*key, limit=_MAX_HEAD)
        except TimeoutError as e:
            raise httpx.ConnectTimeout(f"connecting to {key[0]}:{key[1]} timed out", request=request) from e
        except OSError as e:
            raise httpx.ConnectError(f"cannot connect to {key[0]}:{key[1]}: {e}", request=request) from e
        self.connections_opened += 1
        return _Connection(reader, writer)

    async def _exchange(self, conn: _Connection, payload: bytes, limits: dict, request: httpx.Request | None
                        ) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
        try:
            async with asyncio.timeout(limits.get("write")):
                conn.writer.write(payload)
                await conn.writer.drain()
        except TimeoutError as e:
            raise httpx.WriteTimeout("writing the request timed out", request=request) from e
        except OSError as e:
            raise _Stale() from e
        try:
            async with asyncio.timeout(limits.get("read")):
                try:
                    head = await conn.reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError as e:
                    if not e.partial:
                        raise _Stale() from e
                    raise httpx.RemoteProtocolError("the server closed the connection mid-response",
                                                    request=request) from e
                except ConnectionResetError as e:
                    raise _Stale() from e
                status, headers, keep, length, chunked = _parse_head(head, request)
                if (request is not None and request.method == "HEAD") or status in (204, 304) or 100 <= status < 200:
                    body = b""
                elif chunked:
                    body = await _read_chunked(conn.reader)
                elif length is not None:
                    body = await conn.reader.readexactly(length)
                else:
                    body, keep = await conn.reader.read(), False
        except TimeoutError as e:
            raise httpx.ReadTimeout("reading the response timed out", request=request) from e
        except asyncio.IncompleteReadError as e:
            raise httpx.RemoteProtocolError("the server closed the connection mid-response", request=request) from e
        except (OSError, asyncio.LimitOverrunError, ValueError) as e:
            raise httpx.ReadError(f"reading the response failed: {e!r}", request=request) from e
        return status, headers, body, keep

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


class Origin:
    """Where ``post_json`` sends: the connection key, the ``Host`` header and the base URL's path."""

    __slots__ = ("host_header", "key", "prefix")

    def __init__(self, key: tuple[str, int], host_header: bytes, prefix: bytes) -> None:
        self.key, self.host_header, self.prefix = key, host_header, prefix

    @classmethod
    def of(cls, base_url: str) -> Origin:
        url = httpx.URL(base_url)
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"KeepAliveTransport speaks plain http://, not {url.scheme}://")
        port = url.port or 80
        host = f"[{url.host}]" if ":" in url.host else url.host
        return cls((url.host, port), f"{host}:{port}".encode() if url.port else host.encode(),
                   url.raw_path.rstrip(b"/"))


class _Stale(Exception):
    """The connection was closed before any byte of the response came back."""


def _head(request: httpx.Request) -> bytes:
    target = request.url.raw_path or b"/"
    lines = [request.method.encode() + b" " + target + b" HTTP/1.1"]
    for name, value in request.headers.raw:
        if name.lower() == b"accept-encoding":
            value = b"identity"
        lines.append(name + b": " + value)
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _parse_head(head: bytes, request: httpx.Request | None) -> tuple[int, list[tuple[bytes, bytes]], bool, int | None, bool]:
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise httpx.RemoteProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}", request=request)
    keep = parts[0] == b"HTTP/1.1"
    headers, length, chunked = [], None, False
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise httpx.RemoteProtocolError(f"malformed header line {line[:80]!r}", request=request)
        name, value = name.strip(), value.strip()
        lower = name.lower()
        if lower != b"transfer-encoding":  # the body handed back is already de-chunked
            headers.append((name, value))
        if lower == b"content-length":
            length = int(value)
        elif lower == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif lower == b"connection":
            keep = keep and value.lower() != b"close"
    return int(parts[1]), headers, keep, length, chunked


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                pass
            return bytes(out)
        out += await reader.readexactly(size)
        await reader.readexactly(2)
