"""The process engine's framed channel (cuctx.isolated._wire.Channel), without workers:
`wait` says a message can be read whether it came during the short look before sleeping
or long after it, waits out its timeout when none comes, and sees the other end's close."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from cuctx.isolated import _wire


def pair() -> tuple[_wire.Channel, _wire.Channel]:
    a, b = socket.socketpair()
    return _wire.Channel(a), _wire.Channel(b)


def test_a_message_already_there_is_seen_at_once_and_read_whole():
    sender, reader = pair()
    sender.send(_wire.RESULT, b"answer")
    assert reader.wait(0)
    tag, message = reader.recv()
    assert (tag, bytes(message)) == (_wire.RESULT, b"answer")


def test_a_message_that_comes_after_the_look_wakes_the_sleeping_reader():
    sender, reader = pair()
    later = threading.Timer(20 * _wire.SPIN_S + 0.02, sender.send, (_wire.CALL, b"late"))
    later.start()
    assert reader.wait(None)  # the look before sleeping passed long before it came
    assert bytes(reader.recv()[1]) == b"late"
    later.join()


def test_no_message_waits_out_the_whole_timeout():
    _, reader = pair()
    begin = time.monotonic()
    assert not reader.wait(0.2)
    assert time.monotonic() - begin >= 0.19  # the look is part of the timeout, not all of it


def test_the_other_end_closing_is_seen_and_read_as_the_end():
    sender, reader = pair()
    sender.close()
    assert reader.wait(1)
    with pytest.raises(EOFError):
        reader.recv()
