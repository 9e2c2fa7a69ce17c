"""IsolatedExecutor(engine="ray", address=...) where no Ray head answers: an error that names
the address, within the documented connect timeout (`_ray.CONNECT_TIMEOUT_S`), where Ray's
own ray.init would retry for minutes. No cluster is started here."""

from __future__ import annotations

import socket
import threading

import pytest

import cuctx
from cuctx.isolated import _ray

ray = pytest.importorskip("ray", reason="needs Ray: pip install -e '.[test]' (or 'cuctx[ray]')")

pytestmark = pytest.mark.usefixtures("sim")


def refused(address: str) -> BaseException:
    """What IsolatedExecutor(engine="ray", address=address) raised, in a thread that must be
    done well within the connect timeout (Ray's own retries would take minutes)."""
    if ray.is_initialized():
        ray.shutdown()
    raised: list[BaseException] = []

    def make() -> None:
        try:
            cuctx.IsolatedExecutor(engine="ray", address=address).shutdown()
        except BaseException as exc:  # noqa: BLE001 - what the test looks at
            raised.append(exc)

    thread = threading.Thread(target=make, daemon=True)
    thread.start()
    thread.join(_ray.CONNECT_TIMEOUT_S + 30)
    assert not thread.is_alive(), f"still connecting to {address} after the timeout"
    assert not ray.is_initialized()
    assert raised, f"IsolatedExecutor joined {address}"
    return raised[0]


def test_an_address_where_nothing_answers_fails_naming_it():
    error = refused("127.0.0.1:1")
    assert isinstance(error, ConnectionError)
    assert str(error).startswith(
        "cannot join the Ray cluster at '127.0.0.1:1': no Ray head answered at 127.0.0.1:1 ("
    )
    assert "it has 10 s); start its head there (ray start --head --port=1)" in str(error)


def test_an_address_where_something_else_answers_is_refused():
    with socket.socket() as server:  # answers HTTP/2's greeting as an HTTP/1 server would
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        threading.Thread(target=answer, daemon=True).start()
        error = refused(f"127.0.0.1:{port}")
    assert isinstance(error, ConnectionError)
    assert f"127.0.0.1:{port} answers, but not as a Ray head does" in str(error)


@pytest.mark.parametrize("address", ["nonsense", "host:port", ":6379"])
def test_an_address_that_is_not_one_says_what_is(address):
    error = refused(address)
    assert isinstance(error, ValueError)
    assert f"address={address!r} is not a Ray cluster's address: use 'host:port'" in str(error)
