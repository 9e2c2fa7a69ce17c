"""Driver calls made from inside a host function (a cuLaunchHostFunc callback), through the
raw driver: the sim answers as the real driver did on an H100 (driver 580), and where the
driver would wait for the host function itself (a deadlock), the sim says
CUDA_ERROR_NOT_PERMITTED instead of running work out of order."""

import ctypes

import numpy as np
from cuda.bindings.driver import CUhostFn, CUresult

import cuctx
from cuctx import Device, Stream

OK = CUresult.CUDA_SUCCESS
NOT_PERMITTED = CUresult.CUDA_ERROR_NOT_PERMITTED
NOT_READY = CUresult.CUDA_ERROR_NOT_READY

_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class HostFunction:
    """Runs ``body()`` as a host function; keeps what it returned or raised."""

    def __init__(self, body):
        self.body = body
        self.result = self.error = None
        self.ran = False
        self._callback = _CALLBACK(self._run)  # kept alive while queued
        self.handle = CUhostFn(ctypes.cast(self._callback, ctypes.c_void_p).value)

    def _run(self, _data):
        self.ran = True
        try:
            self.result = self.body()
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            self.error = exc

    def launch(self, drv, stream) -> None:
        assert drv.cuLaunchHostFunc(stream, self.handle, 0) == (OK,)


def run_inside(drv, stream, body):
    fn = HostFunction(body)
    fn.launch(drv, stream)
    assert drv.cuStreamSynchronize(stream) == (OK,)
    assert fn.ran and fn.error is None, fn.error
    return fn.result


# -- both backends ------------------------------------------------------------------------


def test_allocating_and_querying_inside_a_host_function_answer_as_the_driver(backend):
    drv = backend.driver
    with Device(0):
        stream = Stream(Device(0))
        s = stream._handle
        alloc, query, memset = run_inside(
            drv,
            s,
            lambda: (
                drv.cuMemAlloc(16)[0],
                drv.cuStreamQuery(s)[0],
                drv.cuMemsetD8Async(0, 0, 0, s)[0],
            ),
        )
        assert alloc == NOT_PERMITTED
        assert query == NOT_READY  # its own stream is busy running it
        assert memset == OK
        err, ptr = drv.cuMemAlloc(16)  # and outside, as usual
        assert err == OK
        assert drv.cuMemFree(ptr) == (OK,)


def test_asking_for_the_current_context_inside_a_host_function_is_not_permitted(backend):
    drv = backend.driver
    with Device(0):
        stream = Stream(Device(0))
        err = run_inside(drv, stream._handle, lambda: drv.cuCtxGetCurrent()[0])
        assert err == NOT_PERMITTED


# -- the sim --------------------------------------------------------------------------------


def test_waiting_inside_a_host_function_is_not_permitted_on_the_sim(sim):
    drv = sim.driver
    with Device(0):
        stream, other = Stream(Device(0)), Stream(Device(0))
        s = stream._handle
        err, event = drv.cuEventCreate(0)
        assert not err
        assert drv.cuEventRecord(event, s) == (OK,)
        host = np.zeros(4, np.uint8)
        err, ptr = drv.cuMemAlloc(4)
        assert not err
        address = host.__array_interface__["data"][0]
        answers = run_inside(
            drv,
            s,
            lambda: [
                drv.cuStreamSynchronize(s)[0],
                drv.cuStreamSynchronize(other._handle)[0],
                drv.cuCtxSynchronize()[0],
                drv.cuEventSynchronize(event)[0],
                drv.cuMemFree(ptr)[0],
                drv.cuMemcpyDtoH(address, ptr, 4)[0],  # pageable: it would wait
                drv.cuMemcpyDtoHAsync(address, ptr, 4, s)[0],
            ],
        )
        assert answers == [NOT_PERMITTED] * 7
        assert drv.cuStreamQuery(s) == (OK,)  # the refused copies queued nothing
        assert drv.cuMemFree(ptr) == (OK,)
        assert drv.cuEventDestroy(event) == (OK,)


def test_work_queued_inside_a_host_function_runs_after_it_on_the_sim(sim):
    drv = sim.driver
    with Device(0):
        stream, waiting = Stream(Device(0)), Stream(Device(0))
        s = stream._handle
        out = cuctx.pinned_empty(4, np.uint8)
        out[...] = 0
        err, ptr = drv.cuMemAlloc(4)
        assert not err
        seen = []

        def body():
            # Queued behind this host function: neither may run before it returns.
            assert drv.cuMemsetD8Async(ptr, 3, 4, s) == (OK,)
            assert drv.cuMemcpyDtoHAsync(out.ctypes.data, ptr, 4, s) == (OK,)
            seen.append(drv.cuStreamQuery(s)[0])
            seen.append(drv.cuEventQuery(event)[0])
            seen.append(drv.cuStreamQuery(waiting._handle)[0])
            seen.append(out.tolist())

        fn = HostFunction(body)
        fn.launch(drv, s)
        err, event = drv.cuEventCreate(0)
        assert not err
        assert drv.cuEventRecord(event, s) == (OK,)
        assert drv.cuStreamWaitEvent(waiting._handle, event, 0) == (OK,)
        assert drv.cuCtxSynchronize() == (OK,)
        assert fn.error is None, fn.error
        assert seen == [NOT_READY, NOT_READY, NOT_READY, [0, 0, 0, 0]]
        assert out.tolist() == [3, 3, 3, 3]
        assert drv.cuMemFree(ptr) == (OK,)
        assert drv.cuEventDestroy(event) == (OK,)


def test_the_host_function_marker_ends_with_the_function_on_the_sim(sim):
    drv = sim.driver
    with Device(0):
        stream = Stream(Device(0))

        def body():
            raise RuntimeError("a failing host function")

        fn = HostFunction(body)
        fn.launch(drv, stream._handle)
        assert drv.cuStreamSynchronize(stream._handle) == (OK,)
        assert isinstance(fn.error, RuntimeError)
        assert not drv._in_host_function()
        err, ptr = drv.cuMemAlloc(16)
        assert err == OK
        assert drv.cuMemFree(ptr) == (OK,)


def test_a_null_host_function_is_refused_not_called_on_the_sim(sim):
    drv = sim.driver
    with Device(0):
        stream = Stream(Device(0))
        null = CUhostFn(0)
        assert drv.cuLaunchHostFunc(stream._handle, null, 0) == (CUresult.CUDA_ERROR_INVALID_VALUE,)
        assert drv.cuLaunchHostFunc(stream._handle, None, 0) == (CUresult.CUDA_ERROR_INVALID_VALUE,)
        assert drv.cuStreamSynchronize(stream._handle) == (OK,)
