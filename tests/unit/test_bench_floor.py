"""The floor benchmark's HTTP reply framing (``pharos.bench.floor.parse_response``): the load
client must find where each keep-alive reply ends, or its figures count half replies."""

from __future__ import annotations

import pytest

from pharos.bench.floor import HttpError, parse_response, request_bytes


def test_content_length_reply_is_whole_only_with_its_body() -> None:
    """A Content-Length reply is incomplete until its last body byte, then its length is the
    head plus the body, and bytes of the next reply after it are left alone."""
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\nhello"
    assert parse_response(bytearray(reply[:-1])) is None
    assert parse_response(bytearray(reply + b"HTTP/1.1 404")) == (len(reply), 200)


def test_chunked_reply_ends_at_the_zero_chunk() -> None:
    """A chunked reply is whole at the zero-size chunk's blank line, not before."""
    reply = (b"HTTP/1.1 502 Bad Gateway\r\nTransfer-Encoding: chunked\r\n\r\n"
             b"5\r\nhello\r\n3;x=y\r\nabc\r\n0\r\n\r\n")
    for cut in range(1, len(reply)):
        assert parse_response(bytearray(reply[:cut])) is None
    assert parse_response(bytearray(reply + b"more")) == (len(reply), 502)


def test_reply_without_framing_is_refused() -> None:
    """A reply the client could only read to the connection's end is an error, not a guess."""
    with pytest.raises(HttpError):
        parse_response(bytearray(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nx"))


def test_request_bytes_frame_the_body() -> None:
    """The request's Content-Length is the body's, and ``close`` asks for Connection: close."""
    raw = request_bytes(8000, b'{"a":1}', close=True)
    head, body = raw.split(b"\r\n\r\n", 1)
    assert body == b'{"a":1}' and b"Content-Length: 7" in head
    assert b"Connection: close" in head
