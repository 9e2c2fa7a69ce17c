"""Streams named as the user's code names them, in the race checker's fixes (the timeline's
lane labels are tested in test_timeline.py): a variable, an item of a list or dict, an
attribute of ``self``; the default streams by the call that gives them."""

import inspect

import numpy as np

import cuctx


def here() -> int:
    return inspect.currentframe().f_back.f_lineno


def test_a_fix_names_streams_held_in_a_list(backend):
    with cuctx.Device(0):
        streams = [cuctx.Stream(), cuctx.Stream()]
        x = cuctx.empty(16, np.float32, stream=streams[0])
        with cuctx.racecheck("collect") as rc:
            x.fill(1.0, stream=streams[0])
            line = here() + 1
            x.fill(2.0, stream=streams[1])  # nothing orders it after the first fill
        [finding] = rc.findings
        assert finding.fix == f"streams[1].wait(streams[0]) before line {line}"
        cuctx.synchronize()


class Worker:
    def __init__(self) -> None:
        self.stream = cuctx.Stream()

    def step(self, x: cuctx.DeviceArray) -> int:
        x.fill(2.0, stream=self.stream)
        return here() - 1


def test_a_fix_names_the_stream_of_self_and_the_per_thread_default_stream(backend):
    with cuctx.Device(0):
        worker = Worker()
        x = cuctx.empty(16, np.float32, stream=worker.stream)
        worker.stream.synchronize()
        with cuctx.racecheck("collect") as rc:
            x.fill(1.0, stream=cuctx.per_thread_stream())
            line = worker.step(x)
        [finding] = rc.findings
        assert finding.fix == f"self.stream.wait(cuctx.per_thread_stream()) before line {line}"
        cuctx.synchronize()
