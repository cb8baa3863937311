"""Snapshots and the views they hand out, and when a handle's mapping may go.

A :class:`Snapshot` pins one region version; the numpy views of its vectors alias the mapping
and keep the pin alive. A handle closed while pins live (Client.close, Owner.close, a ``with``
block left with a view still referenced) closes its library handle only when the last pin goes,
so closing never blocks on views and a view never reads unmapped memory.
"""

from __future__ import annotations

import ctypes
import json
import threading
import weakref
from ctypes import byref, c_uint64, c_void_p
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from . import _lib
from ._lib import check, lib
from .errors import BufferTooSmallError

if TYPE_CHECKING:  # pragma: no cover
    from .client import _Handle

try:  # numpy is optional: views are memoryviews without it
    import numpy as _np
except ImportError:  # pragma: no cover - exercised only where numpy is missing
    _np = None


class _Lifetime:
    """When a library handle (shmsteer_t*) closes: at close() when no snapshot of it is
    pinned, else when its last pin goes (the last view of its last snapshot is collected).
    Closing the handle under a live pin would wait for it and fail (BusyError), and a view must
    never outlive the mapping, so the close waits for the pins, without blocking anyone."""

    def __init__(self, handle: int) -> None:
        self.handle = handle
        self._lock = threading.Lock()
        self._pins = 0
        self._closing = False
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once the library handle is closed (not only asked to)."""
        return self._closed

    def pin(self) -> None:
        with self._lock:
            self._pins += 1

    def unpin(self) -> None:
        with self._lock:
            self._pins -= 1
            last = self._closing and self._pins == 0 and not self._closed
            if last:
                self._closed = True
        if last:
            _quiet_close(lib.shmsteer_close, self.handle)  # from a finalizer: nobody to tell

    def close(self) -> None:
        """Close the handle now (raising what the library reports), or when its last pin goes."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            if self._pins > 0:
                return
            self._closed = True
        check(lib.shmsteer_close(self.handle))


def _quiet_close(fn: Any, handle: int) -> None:
    """Release a handle from a finalizer: errors (a forked child, a closed owner) are moot."""
    try:
        fn(handle)
    except Exception:  # pragma: no cover - finalizers must not raise
        pass


def _unpin(handle: int, life: _Lifetime) -> None:
    _quiet_close(lib.shmsteer_snapshot_close, handle)
    life.unpin()


class _Pin:
    """Holds a pinned snapshot; unpins when the last reference (the Snapshot, or a view) dies,
    and then lets its handle close if it was closed meanwhile (_Lifetime)."""

    def __init__(self, handle: int, life: _Lifetime) -> None:
        self.handle = handle
        life.pin()
        self.final = weakref.finalize(self, _unpin, handle, life)


@dataclass(frozen=True)
class VectorEntry:
    """One entry of a named vector: add ``scale * data`` at (hook, layer). ``data`` is a
    read-only numpy array (a memoryview without numpy) aliasing the shared mapping."""

    hook: str
    layer: int
    scale: float
    data: Any


@dataclass(frozen=True)
class ImportedVector:
    """A named vector registered from a file: the region version that wrote it, the sha256
    of its encoding (as :attr:`NamedVector.digest` reports) and the model hint stored with it
    (``""`` when none)."""

    name: str
    version: int
    digest: bytes
    model_hint: str = ""


@dataclass(frozen=True)
class NamedVector:
    name: str
    version: int
    digest: bytes
    entries: List[VectorEntry]


def _view(ptr: int, n: int, pin: Any) -> Any:
    """A read-only float32 view of n floats at ptr that keeps ``pin`` alive."""
    arr = (ctypes.c_float * n).from_address(ptr)
    arr._shmsteer_pin = pin  # the view's memory stays pinned while the view lives
    mv = memoryview(arr).toreadonly()
    if _np is None:
        return mv
    return _np.frombuffer(mv, dtype=_np.float32)


class Snapshot:
    """A pinned region version; every read through it sees that one version.

    Vector views alias the mapping (zero bytes copied) and keep the version pinned: if the
    snapshot is closed while views are alive, the unpin is deferred until the last view is
    garbage collected (:attr:`pinned` says whether the version is still pinned). So a view can
    never read reclaimed memory, and never silently outlives its pin.
    """

    def __init__(self, parent: "_Handle", version: int = 0) -> None:
        out = c_void_p()
        pinned = c_uint64()
        from .client import U64, _int
        check(lib.shmsteer_snapshot_open(parent.handle, _int("version", version, U64), byref(out), byref(pinned)))
        self._parent = parent
        self._pin: Optional[_Pin] = _Pin(out.value, parent._life)
        self._final = self._pin.final
        self.version: int = pinned.value

    def __enter__(self) -> "Snapshot":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._pin is None

    @property
    def pinned(self) -> bool:
        """True while the version is pinned: before close(), or after it while views live."""
        return self._final.alive

    def close(self) -> None:
        """Release the pin now, or when the last view taken from this snapshot dies."""
        self._pin = None  # the finalizer runs once no view references the pin

    def _handle(self) -> int:
        if self._pin is None:
            from .errors import ClosedError
            raise ClosedError("shmsteer: snapshot closed")
        return self._pin.handle

    def vector(self, name: str, kind: str = "steer") -> NamedVector:
        """Named vector ``name`` of ``kind`` (``"steer"`` or ``"probe"``) at this version, its
        floats as read-only views of the mapping."""
        from .client import _b, _kind_call
        view = _kind_call(kind, lib.shmsteer_vector_view, lib.shmsteer_probe_view)
        h = self._handle()
        nb = _b(name)
        info = _lib.VectorInfo()
        cap = 8
        while True:
            entries = (_lib.VectorEntry * cap)()
            rc = view(h, nb, len(nb), byref(info), entries, cap)
            if rc == BufferTooSmallError.code and info.n_entries > cap:
                cap = info.n_entries
                continue
            check(rc)
            break
        hooks = self._parent.model[2]
        out = []
        for e in entries[: info.n_entries]:
            ptr = ctypes.cast(e.data, c_void_p).value or 0
            out.append(VectorEntry(hooks[e.hook], e.layer, e.scale, _view(ptr, e.len, self._pin)))
        return NamedVector(name, info.version, bytes(info.digest), out)

    def model_hint(self, name: str) -> str:
        """The model hint stored with steering vector ``name`` at this version (a GGUF's
        ``controlvector.model_hint``; ``""`` when it has none)."""
        from .client import _b
        nb = _b(name)
        h = self._handle()
        out = _lib.read_json(lambda _, buf, cap, n: lib.shmsteer_vector_model_hint(h, nb, len(nb), buf, cap, n), h)
        return out.decode("utf-8")

    def vectors(self, kind: str = "steer") -> List[Dict[str, Any]]:
        """[{name, version, digest[, model_hint]}] of the named vectors of ``kind`` at this
        version (model_hint when a steering vector has one)."""
        from .client import _kind_call
        list_json = _kind_call(kind, lib.shmsteer_vector_list_json, lib.shmsteer_probe_list_json)
        return json.loads(_lib.read_json(list_json, self._handle()))
