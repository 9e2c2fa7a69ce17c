"""The compile cache's entries: their format, checked on every read, and their files, written
atomically. docs/compiler.md describes both."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# Bump whenever the entry layout or the meaning of the key changes; it is
# hashed into the key and written into every entry header.
CACHE_FORMAT_VERSION = 3
_MAGIC = b"CUCTXNVR"
# magic, format version, payload length, sha256(payload)
_HEADER = struct.Struct("<8sIQ32s")
_BLOB_LEN = struct.Struct("<Q")

_warned_dirs: set[str] = set()
_warned_lock = threading.Lock()


class CacheWarning(RuntimeWarning):
    """The compile cache could not be used; compilation went ahead without it."""


@dataclass(frozen=True, repr=False)
class CompileResult:
    """A compiled (or linked) image.

    ``image`` is exactly what the compiler returned: for ``kind == "ptx"`` it
    keeps the trailing NUL, which cuModuleLoadData requires; ``kind ==
    "ltoir"`` is LTO-IR, which is linked (`Library.link`), never loaded.
    ``ptx`` is the PTX of the same program (the image itself for ``kind ==
    "ptx"``), from which cuctx reads the parameter types a cubin does not
    record; None where the compiler had none to give (LTO-IR). ``name`` is the
    program's name, which names the piece in a link's errors.
    """

    image: bytes
    kind: Literal["cubin", "ptx", "ltoir"]
    arch: str
    lowered_names: dict[str, str]
    log: str
    from_cache: bool
    ptx: bytes | None = None
    name: str = ""

    def __repr__(self) -> str:  # (the image and the log can be megabytes: not printed)
        name = f" {self.name!r}" if self.name else ""
        cached = ", from the cache" if self.from_cache else ""
        return f"<CompileResult {self.kind}{name} for {self.arch}, {len(self.image)} bytes{cached}>"


# Where an entry's PTX is: none, the image itself (kind "ptx"), or its own blob.
_PTX_PLACES = ("none", "image", "blob")


def _encode_entry(key: str, result: CompileResult) -> bytes:
    if result.ptx is None:
        place, blob = "none", b""
    elif result.ptx == result.image:
        place, blob = "image", b""  # stored once
    else:
        place, blob = "blob", result.ptx
    meta = json.dumps(
        {
            "key": key,
            "kind": result.kind,
            "arch": result.arch,
            "lowered_names": result.lowered_names,
            "log": result.log,
            "ptx": place,
            "name": result.name,
        }
    ).encode()
    payload = (
        _BLOB_LEN.pack(len(result.image)) + result.image + _BLOB_LEN.pack(len(blob)) + blob + meta
    )
    return (
        _HEADER.pack(_MAGIC, CACHE_FORMAT_VERSION, len(payload), hashlib.sha256(payload).digest())
        + payload
    )


def _blob(payload: bytes, start: int) -> tuple[bytes, int] | None:
    """The length-prefixed bytes at ``start`` and where they end; None past the payload."""
    if start + _BLOB_LEN.size > len(payload):
        return None
    (length,) = _BLOB_LEN.unpack_from(payload, start)
    end = start + _BLOB_LEN.size + length
    if end > len(payload):
        return None
    return payload[start + _BLOB_LEN.size : end], end


def _decode_entry(data: bytes, key: str) -> CompileResult | None:
    """The entry's result, or None if ``data`` is not an intact entry for ``key``."""
    if len(data) < _HEADER.size:
        return None
    magic, version, length, digest = _HEADER.unpack_from(data)
    payload = data[_HEADER.size :]
    if magic != _MAGIC or version != CACHE_FORMAT_VERSION or length != len(payload):
        return None
    if hashlib.sha256(payload).digest() != digest:
        return None
    image = _blob(payload, 0)
    ptx = image and _blob(payload, image[1])
    if not ptx:
        return None
    try:
        meta = json.loads(payload[ptx[1] :])
    except ValueError:
        return None
    if not _valid_meta(meta, key) or (meta["ptx"] != "blob" and ptx[0]):
        return None
    return CompileResult(
        image=image[0],
        kind=meta["kind"],
        arch=meta["arch"],
        lowered_names=meta["lowered_names"],
        log=meta["log"],
        from_cache=True,
        ptx={"none": None, "image": image[0], "blob": ptx[0]}[meta["ptx"]],
        name=meta["name"],
    )


def _valid_meta(meta, key: str) -> bool:
    return (
        isinstance(meta, dict)
        and meta.get("key") == key
        and meta.get("kind") in ("cubin", "ptx", "ltoir")
        and isinstance(meta.get("name"), str)
        and isinstance(meta.get("arch"), str)
        and isinstance(meta.get("log"), str)
        and isinstance(meta.get("lowered_names"), dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in meta["lowered_names"].items())
        and meta.get("ptx") in _PTX_PLACES
    )


def _load_entry(path: Path, key: str) -> CompileResult | None:
    try:
        data = path.read_bytes()
    except OSError:
        # Missing, or unreadable: either way a miss; the store reports problems.
        return None
    result = _decode_entry(data, key)
    if result is None:
        # A damaged entry must never be loaded; remove it so the rebuilt one
        # replaces it. Losing a race with a writer only costs a recompile.
        try:
            path.unlink()
        except OSError:
            pass
    return result


def _store_entry(path: Path, key: str, result: CompileResult) -> None:
    data = _encode_entry(key, result)
    tmp_name = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Same directory as the target so os.replace is an atomic rename:
        # readers see the old entry or the complete new one, never a mix.
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except OSError as exc:
        if tmp_name is not None:
            try:
                os.unlink(tmp_name)
            except OSError:
                pass
        _warn_unwritable(path.parent, exc)


def _warn_unwritable(directory: Path, exc: OSError) -> None:
    with _warned_lock:
        if str(directory) in _warned_dirs:
            return
        _warned_dirs.add(str(directory))
    warnings.warn(
        f"cuctx compile cache at {directory} is not writable ({exc}); compiling without caching",
        CacheWarning,
        stacklevel=4,
    )
