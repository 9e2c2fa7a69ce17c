"""Interop descriptions: the CUDA Array Interface read checked, and DLPack capsules
(exporting device memory, and reading capsules other libraries export).

CUDA Array Interface. A malformed description is a TypeError naming the field, before
anything uses the pointer.

Export. A consumer that rejects a capsule (``np.from_dlpack`` of device memory, say) drops
it while its own exception is in flight, and the capsule's destructor runs then. A
destructor written in Python (a ctypes callback) cannot run with an exception set: CPython
reports it as "returned NULL without setting an exception" and the tensor's deleter never
runs, so the memory leaks. The destructor and the deleter must be C that touches only
reference counts, as the DLPack spec requires. NumPy has exactly that: cuctx describes the
device memory to NumPy (an ``__array_interface__`` that NumPy never reads through), lets
NumPy build the legacy ("dltensor") or versioned ("dltensor_versioned") capsule for the
version the consumer asks for, and sets the tensor's device to (kDLCUDA, ordinal) in the
capsule's DLTensor (standard DLPack layout). Releasing the capsule or calling its deleter
drops NumPy's reference to the holder, which holds the DeviceArray: Python's deallocation
keeps any in-flight exception, so every path frees, and the consumer's error reaches its
caller.

Import. ctypes describes the DLPack structs of both versions; the consumed capsule is
renamed ("used_dltensor[_versioned]") and its deleter is called when the last array using
the memory goes.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Any

import numpy as np

from ._layout import dtype_of, shape_of

DL_CPU, DL_CUDA = 1, 2  # DLPack device types
_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", _DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_LEGACY, _VERSIONED = b"dltensor", b"dltensor_versioned"  # module constants: capsules keep them
_USED = {_LEGACY: b"used_dltensor", _VERSIONED: b"used_dltensor_versioned"}
_STRUCT = {_LEGACY: _DLManagedTensor, _VERSIONED: _DLManagedTensorVersioned}
_DL_CODE = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
_DL_KIND = {v: k for k, v in _DL_CODE.items()}

_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]


# -- the CUDA Array Interface ---------------------------------------------------------------


def _field(cai: dict, key: str, check, what: str) -> Any:
    """One required field of a CUDA Array Interface, or a TypeError naming it."""
    if key not in cai:
        raise TypeError(
            f"cuctx.asarray: the __cuda_array_interface__ has no {key!r} (it must be {what})"
        )
    value = cai[key]
    if not check(value):
        raise TypeError(
            f"cuctx.asarray: __cuda_array_interface__[{key!r}] must be {what}, not {value!r}"
        )
    return value


def _ints(value, length: int | None = None) -> bool:
    return (
        isinstance(value, (tuple, list))
        and (length is None or len(value) == length)
        and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value)
    )


def _pointer(value) -> bool:
    return (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and isinstance(value[0], (int, np.integer))
        and isinstance(value[1], bool)
    )


def read_cai(cai: Any):
    """(ptr, shape, dtype, strides or None, stream or None) of a CUDA Array Interface
    (versions 0 to 3), checked: a missing or malformed field is a TypeError naming it."""
    if not isinstance(cai, dict):
        raise TypeError(
            f"cuctx.asarray: __cuda_array_interface__ must be a dict, not {type(cai).__name__}"
        )
    _field(cai, "version", lambda v: type(v) is int and 0 <= v <= 3, "an int from 0 to 3")
    shape = shape_of(tuple(_field(cai, "shape", _ints, "a tuple of ints")))
    typestr = _field(cai, "typestr", lambda v: isinstance(v, str), "a str such as '<f4'")
    data = _field(cai, "data", _pointer, "a tuple (pointer: int, read-only: bool)")
    strides = cai.get("strides")
    if strides is not None:
        _field(
            cai,
            "strides",
            lambda v: _ints(v, len(shape)),
            f"None or a tuple of {len(shape)} ints (bytes)",
        )
        strides = tuple(int(s) for s in strides)
    if cai.get("mask") is not None:
        raise ValueError(
            "cuctx.asarray: masked arrays (a CUDA Array Interface 'mask') are not supported"
        )
    if data[1]:
        raise ValueError(
            "cuctx.asarray: the producer exports this memory read-only, and "
            "cuctx device arrays are writable; copy it in that library first"
        )
    try:
        dtype = _bits_of_raw(np.dtype(typestr))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"cuctx.asarray: __cuda_array_interface__['typestr'] {typestr!r} is not a dtype ({exc})"
        ) from None
    stream = cai.get("stream")
    if stream is not None and (type(stream) is not int or stream == 0):
        raise TypeError(
            f"cuctx.asarray: __cuda_array_interface__['stream'] must be None or "
            f"a nonzero int, not {stream!r}"
        )
    return int(data[0]), shape, dtype_of(dtype), strides, stream


def _bits_of_raw(dtype: np.dtype) -> np.dtype:
    """Raw elements of 1, 2, 4 or 8 bytes (a void typestr: PyTorch describes bfloat16 as
    '<V2', float8 types as '|V1'; NumPy has no such floats) as unsigned integers of their
    size, so they are viewed, copied and passed to kernels as ordinary arrays of their bits
    (a ``__nv_bfloat16*`` parameter takes uint16 arrays); any other dtype as it is."""
    if (
        dtype.kind == "V"
        and dtype.names is None
        and dtype.subdtype is None
        and dtype.itemsize in (1, 2, 4, 8)
    ):
        return np.dtype(f"u{dtype.itemsize}")
    return dtype


# -- export ---------------------------------------------------------------------------------


class _Described:
    """What NumPy sees of the exported memory: a description it never reads through. It
    holds ``owner`` (the DeviceArray) for as long as the capsule's tensor lives."""

    __slots__ = ("__array_interface__", "owner")

    def __init__(self, owner: Any, ptr: int, shape, strides, dtype: np.dtype):
        self.owner = owner
        self.__array_interface__ = {
            "data": (ptr, False),
            "shape": shape,
            "typestr": dtype.str,
            "strides": strides,
            "version": 3,
        }


def export(
    owner: Any,
    ptr: int,
    shape,
    strides,
    dtype: np.dtype,
    device: tuple[int, int],
    max_version: Any = None,
):
    """A DLPack capsule of the memory at ``ptr`` on ``device`` ((type, id)), versioned when
    ``max_version`` is (1, x) or newer, that keeps ``owner`` alive until released."""
    if max_version is not None:
        try:
            major = int(max_version[0])
        except (TypeError, ValueError, IndexError):
            raise TypeError(
                f"max_version must be None or a (major, minor) tuple, not {max_version!r}"
            ) from None
    versioned = max_version is not None and major >= 1
    described = np.asarray(_Described(owner, ptr, shape, strides, dtype))
    try:
        capsule = described.__dlpack__(max_version=(1, 0)) if versioned else described.__dlpack__()
    except TypeError:  # NumPy < 2.1 exports legacy capsules only (a legal answer)
        capsule = described.__dlpack__()
    name = _VERSIONED if _api.PyCapsule_IsValid(capsule, _VERSIONED) else _LEGACY
    managed = _STRUCT[name].from_address(_api.PyCapsule_GetPointer(capsule, name))
    managed.dl_tensor.device = _DLDevice(*device)
    return capsule


# -- import ---------------------------------------------------------------------------------


class _Consumed:
    """Holds a consumed DLPack tensor; calls its deleter when the last array using it goes."""

    __slots__ = ("__weakref__",)

    def __init__(self, address: int, deleter: int):
        weakref.finalize(self, _DELETER(deleter), address).atexit = False


def consume(capsule: Any):
    """Read a capsule another library exported: (ptr, shape, strides or None, dtype,
    (device type, id), owner). The capsule is marked used; ``owner`` calls the tensor's
    deleter when it goes. Raises (leaving the capsule to its producer) when cuctx cannot
    use the tensor."""
    for name in (_VERSIONED, _LEGACY):
        if _api.PyCapsule_IsValid(capsule, name):
            break
    else:
        raise TypeError("__dlpack__ returned something that is not an unused DLPack capsule")
    address = _api.PyCapsule_GetPointer(capsule, name)
    managed = _STRUCT[name].from_address(address)
    if name == _VERSIONED:
        if managed.major != 1:
            raise BufferError(
                f"DLPack version {managed.major}.{managed.minor} is not supported (1.x is)"
            )
        if managed.flags & _READ_ONLY:
            raise BufferError(
                "the DLPack tensor is read-only, and cuctx device arrays are "
                "writable; copy it in the producing library first"
            )
    tensor = managed.dl_tensor
    code, bits, lanes = tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes
    if code not in _DL_KIND or lanes != 1 or bits % 8:
        raise TypeError(
            f"DLPack dtype (code {code}, {bits} bits, {lanes} lanes) has no NumPy equivalent"
        )
    dtype = np.dtype(f"{_DL_KIND[code]}{bits // 8}" if code != 6 else "?")
    ndim = tensor.ndim
    shape = tuple(tensor.shape[i] for i in range(ndim))
    strides = (
        tuple(tensor.strides[i] * dtype.itemsize for i in range(ndim)) if tensor.strides else None
    )
    ptr = (tensor.data or 0) + tensor.byte_offset
    device = (tensor.device.device_type, tensor.device.device_id)
    _api.PyCapsule_SetName(capsule, _USED[name])  # ours now: its destructor must not delete
    owner = _Consumed(address, managed.deleter) if managed.deleter else None
    return ptr, shape, strides, dtype, device, owner
