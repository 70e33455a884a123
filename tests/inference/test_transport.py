"""KeepAliveTransport: the same answers as httpx's own transport from a real ``agentrl serve``,
and httpx's exceptions for every way a peer can misbehave (raw asyncio servers written here
play the misbehaving peer)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import pytest

from agentrl.client.transport import KeepAliveTransport, Origin


async def test_answers_match_httpx_and_connections_are_kept(server):
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, "temperature": 0.0},
            "return_logprob": True}
    transport = KeepAliveTransport()
    async with httpx.AsyncClient(base_url=server, timeout=60) as plain, \
            httpx.AsyncClient(base_url=server, timeout=60, transport=transport) as lean:
        for path, kwargs in (("/generate", {"json": body}), ("/generate", {"json": {**body, "stream": True}}),
                             ("/generate", {"json": {"input_ids": "x"}}), ("/model_info", {})):
            method = "post" if "json" in kwargs else "get"
            a = await getattr(plain, method)(path, **kwargs)
            b = await getattr(lean, method)(path, **kwargs)
            assert a.status_code == b.status_code
            if path == "/generate" and a.status_code == 200 and "stream" not in kwargs["json"]:
                assert a.json()["output_ids"] == b.json()["output_ids"]
            elif a.headers.get("content-type", "").startswith("text/event-stream"):  # chunked, de-chunked here
                def last(r):
                    return json.loads(r.text.split("data: ")[-2])["output_ids"]  # how events group is timing
                assert b.text.endswith("data: [DONE]\n\n") and last(a) == last(b)
            else:
                assert a.json().keys() == b.json().keys()
        answers = await asyncio.gather(*(lean.get("/health") for _ in range(20)))
        assert all(r.status_code == 200 for r in answers)
    assert transport.connections_opened <= 21  # sequential calls shared one connection


async def test_post_json_answers_like_httpx_on_the_same_connections(server):
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}}
    transport = KeepAliveTransport()
    async with httpx.AsyncClient(base_url=server, timeout=60, transport=transport) as http:
        want = await http.post("/generate", json=body)
        status, content = await transport.post_json(Origin.of(server + "/"), "/generate", json.dumps(body).encode(),
                                                     read_timeout=60)
        assert (status, json.loads(content)["output_ids"]) == (200, want.json()["output_ids"])
        status, content = await transport.post_json(Origin.of(server), "/generate", b'{"input_ids": "x"}',
                                                    read_timeout=60)
        assert status == 400 and "input_ids" in json.loads(content)["error"]["message"]
    assert transport.connections_opened == 1


async def test_post_json_writes_one_plain_request():
    seen = []

    async def record(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1])
        seen.append(head + await reader.readexactly(length))
        writer.write(answer(b'{"ok": true}'))
        await writer.drain()
        writer.close()

    async with peer(record) as url:
        status, content = await KeepAliveTransport().post_json(
            Origin.of(url + "/base/"), "/generate", b'{"a": 1}', read_timeout=5, headers=b"Authorization: Bearer k\r\n")
    port = url.rsplit(":", 1)[1]
    assert (status, content) == (200, b'{"ok": true}')
    assert seen == [f"POST /base/generate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                    "Accept-Encoding: identity\r\nAuthorization: Bearer k\r\nContent-Length: 8\r\n\r\n"
                    '{"a": 1}'.encode()]
    with pytest.raises(httpx.UnsupportedProtocol):
        Origin.of("https://example.org")


@contextlib.asynccontextmanager
async def peer(handler):
    """A raw TCP server on 127.0.0.1 running ``handler(reader, writer)`` per connection."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


def answer(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: " + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body


async def test_a_connection_closed_while_idle_is_replaced(tmp_path):
    async def once_then_close(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer(b"ok"))  # keep-alive by default, but the server closes anyway
        await writer.drain()
        writer.close()

    transport = KeepAliveTransport()
    async with peer(once_then_close) as url, httpx.AsyncClient(transport=transport, timeout=5) as http:
        for _ in range(3):
            assert (await http.get(url)).text == "ok"
            await asyncio.sleep(0.05)
    assert transport.connections_opened == 3


async def test_a_request_that_meets_a_closing_connection_is_sent_again():
    async def one_answer_per_connection(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer(b"ok"))
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")  # the next request on this connection: hang up unanswered
        writer.close()

    transport = KeepAliveTransport()
    async with peer(one_answer_per_connection) as url, httpx.AsyncClient(transport=transport, timeout=5) as http:
        assert [(await http.post(url, json={"n": i})).text for i in range(3)] == ["ok"] * 3
    assert transport.connections_opened == 3


async def test_chunked_bodies_with_trailers_and_http_1_0():
    async def chunked(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n2\r\nde\r\n0\r\n"
                     b"x-trailer: 1\r\n\r\n")
        await writer.drain()

    async def old(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nuntil the end")
        await writer.drain()
        writer.close()

    async with peer(chunked) as a, peer(old) as b, httpx.AsyncClient(transport=KeepAliveTransport(), timeout=5) as http:
        r = await http.get(a)
        assert r.text == "abcde" and "transfer-encoding" not in r.headers
        assert (await http.get(b)).text == "until the end"


async def test_misbehaving_peers_raise_httpx_errors():
    async def silent(reader, writer):
        await asyncio.sleep(30)

    async def half(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort")
        await writer.drain()
        writer.close()

    async def garbage(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()

    async def hang_up(reader, writer):
        writer.close()

    async with peer(silent) as s, peer(half) as h, peer(garbage) as g, peer(hang_up) as u:
        async with httpx.AsyncClient(transport=KeepAliveTransport(), timeout=httpx.Timeout(5, read=0.3)) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.get(s)
            with pytest.raises(httpx.RemoteProtocolError, match="mid-response"):
                await http.get(h)
            with pytest.raises(httpx.RemoteProtocolError, match="status line"):
                await http.get(g)
            with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
                await http.get(u)
            closed = s.rsplit(":", 1)[0] + ":1"
            with pytest.raises(httpx.ConnectError):
                await http.get(closed)
            with pytest.raises(httpx.UnsupportedProtocol):
                await http.get("https://127.0.0.1:1/")


async def test_our_servers_answer_without_waiting_for_a_delayed_ack():
    """The bug: ``launch.services.bind`` made its socket with proto 0, asyncio sets TCP_NODELAY
    only where proto says TCP, so every response written as head + body (uvicorn's way) sat in
    Nagle's buffer until the client's delayed ACK: ~44 ms per keep-alive control call (pause,
    continue, model_info, each weight-update request). Accepted connections now have NODELAY."""
    import socket

    from agentrl.process.services import bind

    sock = bind("127.0.0.1", 0)
    sock.listen()
    accepted: asyncio.Future = asyncio.get_running_loop().create_future()

    async def on_connect(reader, writer):
        accepted.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(on_connect, sock=sock)
    try:
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        assert await asyncio.wait_for(accepted, 10) != 0
        writer.close()
    finally:
        server.close()
