"""The Ray engine's call channel (cuctx.isolated._channel), without Ray: an actor's listener
serves the one connection that knows the secret the caller sent it, and only that one; what
it runs answers each message in order; a caller's connection to nothing fails within its
timeout, naming no secret."""

from __future__ import annotations

import socket
from multiprocessing import AuthenticationError

import pytest

from cuctx.isolated import _channel

KEY = b"k" * 32


def answer(message: memoryview) -> bytes:
    return b"echo " + bytes(message)


def test_calls_and_answers_go_over_the_channel_in_order():
    address = _channel.serve("127.0.0.1", KEY, answer)
    with _channel.connect(address, KEY, timeout=5) as conn:
        for k in range(3):
            conn.send_bytes(b"call %d" % k)
        assert [conn.recv_bytes() for _ in range(3)] == [
            b"echo call 0",
            b"echo call 1",
            b"echo call 2",
        ]
        big = bytes(range(256)) * 4096  # 1 MiB: past one socket buffer
        conn.send_bytes(big)
        assert conn.recv_bytes() == b"echo " + big


def test_a_connection_without_the_secret_is_refused_and_the_caller_still_gets_in():
    address = _channel.serve("127.0.0.1", KEY, answer)
    with pytest.raises(AuthenticationError):
        _channel.connect(address, b"x" * 32, timeout=5)
    with socket.create_connection(address, timeout=5):  # one that says nothing, then goes
        pass
    with _channel.connect(address, KEY, timeout=5) as conn:
        conn.send_bytes(b"hello")
        assert conn.recv_bytes() == b"echo hello"


def test_a_channel_serves_one_caller_only():
    address = _channel.serve("127.0.0.1", KEY, answer)
    with _channel.connect(address, KEY, timeout=5) as conn:
        conn.send_bytes(b"first")
        assert conn.recv_bytes() == b"echo first"
        with pytest.raises(OSError):  # the listener closed once its caller was in
            _channel.connect(address, KEY, timeout=5)


def test_connecting_where_nothing_listens_fails():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = s.getsockname()  # bound, never listening: the connection is refused
        with pytest.raises(OSError):
            _channel.connect(address, KEY, timeout=5)
