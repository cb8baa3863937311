"""The key registry of a handle (``client.keys``, ``owner.keys``): :class:`Keys`.

A key get (``keys[id]``) is the hot path of a serving worker. It reads through a reader of the
calling thread's own (a reader slot, whose gets of a live key the library answers in C without
entering its Go runtime), in one of two ways that give the same answers and raise the same
exceptions:

* the extension ``shmsteer._fastkeys`` (``_fastkeys.c``, built by ``go generate ./capi`` beside
  libshmsteer.so when Python's headers are installed): ``keys[id]`` is a C type slot that calls
  the library's ``shmsteer_reader_key_get`` (no Python frame, no ctypes call);
* ctypes (``Keys.__getitem__``), when the extension is not built, does not load, or
  ``$SHMSTEER_KEYS_CTYPES`` is set to a non-empty value other than ``0`` when this module is
  imported (for tests and comparisons).

:data:`FAST_KEYS` says which one handles' ``keys`` use (:data:`FAST_KEYS_REASON` says why not).
Both call only the C ABI (shmsteer.h); neither knows the region's layout.
"""

from __future__ import annotations

import ctypes
import json
import threading
from collections.abc import MutableMapping
from ctypes import byref, c_size_t, c_void_p
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Set, Tuple, Type, Union

from . import _lib
from ._lib import check, lib
from .errors import BufferTooSmallError, KeyNotFoundError, KeyRevokedError

if TYPE_CHECKING:  # pragma: no cover
    from .client import _Handle

#: At most this many threads of one Keys read through a reader slot of their own (the region's
#: slots are shared by every process); later threads read through the handle's shared slots.
THREAD_READERS = 16

#: Set (to anything but "" or "0") when this module is imported: key gets go through ctypes even
#: when the extension is built.
KEYS_CTYPES_ENV = "SHMSTEER_KEYS_CTYPES"

_TOO_SMALL = BufferTooSmallError.code


class _ThreadReader:
    """A thread's shmsteer_reader_t: its reader slot goes back when the thread's local state
    goes (the thread ends, or the Keys object is collected), or when the handle closes
    (:func:`close_readers`, first: a reader must not outlive its handle's mapping)."""

    __slots__ = ("handle", "keys")

    def __init__(self, handle: c_void_p, keys: "Keys") -> None:
        self.handle, self.keys = handle, keys
        keys._open.add(handle.value)

    def __del__(self) -> None:
        try:
            self.keys._open.remove(self.handle.value)  # atomic: one of this and close_readers
        except KeyError:
            pass  # closed with the handle
        else:
            try:
                lib.shmsteer_reader_close(self.handle)
            except Exception:  # interpreter shutdown: the process is ending anyway
                pass
        self.keys._count_reader(-1)


def close_readers(open_readers: Set[int]) -> None:
    """Close every reader in ``open_readers`` (a handle's, see :class:`Keys`) and empty it: the
    handle closes them first, so that no thread reader is left to close later (the library's
    shmsteer_close would free them too: a get through one afterwards answers BAD_HANDLE, and
    closing one then does nothing). Their threads' later gets raise ClosedError. A get running in another thread meanwhile is undefined, as closing a handle
    while it is used is. A :class:`~shmsteer.Follower` closes its clients' readers when it
    closes; a client it replaced is closed by the library 10 s later, without its readers: do not
    read through a replaced client's keys after that (take the current client per unit of work)."""
    while True:
        try:
            h = open_readers.pop()
        except KeyError:
            return
        try:
            lib.shmsteer_reader_close(c_void_p(h))
        except Exception:  # interpreter shutdown: the process is ending anyway
            pass


def _id_bytes(request_id: Union[str, bytes]) -> bytes:
    return request_id if isinstance(request_id, bytes) else request_id.encode()


def _key_bytes(key: Any) -> bytes:
    """A key value as bytes: only bytes-like objects (bytes, bytearray, memoryview, any buffer).

    ``bytes(12)`` would be 12 zero bytes and ``bytes([1, 2])`` a list's values: both refused."""
    if isinstance(key, bytes):
        return key
    try:
        return memoryview(key).tobytes()
    except TypeError:
        raise TypeError(f"shmsteer: a key must be bytes-like (bytes, bytearray, memoryview), "
                        f"not {type(key).__name__}") from None


class Keys(MutableMapping):
    """The key registry as a mapping ``request id -> key bytes``.

    Reads come from the shared mapping (lock-free); writes go to the owner. ``keys[id]`` raises
    :class:`~shmsteer.errors.KeyRevokedError` for a revoked key (its sentinel still stands) and
    :class:`~shmsteer.errors.KeyNotFoundError` (a ``KeyError``) for a missing one; ``del keys[id]``
    revokes it (the owner purges it after the grace period). Iteration lists ids with a live key,
    and in the owner also ids whose revoked sentinel stands (see :meth:`entries`).

    A Keys may be used from any number of threads: each thread reads through a reader of its own
    (at most :data:`THREAD_READERS` per Keys). Handles make theirs with :func:`new_keys` (the
    extension's get when it is built, see the module's doc); this class is the ctypes one.
    """

    def __init__(self, parent: "_Handle") -> None:
        self._parent = parent
        self._open: Set[int] = parent._reader_handles  # closed by the handle before it closes
        self._local = threading.local()
        self._readers = [0]  # threads reading through a reader of their own (THREAD_READERS)
        self._readers_lock = threading.RLock()  # re-entrant: a reader's __del__ may run in GC

    def _state(self) -> Tuple[Any, ...]:
        """This thread's pre-converted call arguments (the key get is the hot path): a reader of
        this thread's own (a reader slot, whose gets of live keys the library answers in C without
        entering its Go runtime), the get function and a view of this thread's C key buffer.
        Past THREAD_READERS threads, or without a free reader slot, it reads through the handle's
        shared slots instead. Raises ClosedError once the handle is closed."""
        handle = self._parent.handle  # ClosedError before anything is counted or opened
        buf = (ctypes.c_char * _lib.KEY_BUFFER_BYTES).from_address(lib.shmsteer_key_buffer())
        r = c_void_p()
        counted = self._count_reader(1)
        if counted and lib.shmsteer_reader_open(handle, byref(r)) == 0:
            self._local.reader = _ThreadReader(r, self)
            if self._parent._h is None:  # closed meanwhile by another thread: close this one too
                close_readers(self._open)
            st = self._local.st = (r, _lib.fast.shmsteer_reader_key_get_tls, buf)
        else:
            if counted:  # no free reader slot
                self._count_reader(-1)
            st = self._local.st = (c_void_p(handle), _lib.fast.shmsteer_key_get_tls, buf)
        return st

    def _thread_handle(self) -> Tuple[int, bool]:
        """(handle, is a reader) this thread reads through, as :meth:`_state` opened it: a
        reader of its own, or the handle's shared slots. The extension's get asks for it once per
        thread (and Keys)."""
        try:
            st = self._local.st
        except AttributeError:
            st = self._state()
        return st[0].value or 0, st[1] is _lib.fast.shmsteer_reader_key_get_tls

    def _count_reader(self, d: int) -> bool:
        """Take (d = 1: False when THREAD_READERS are taken) or give back (d = -1) a thread reader."""
        with self._readers_lock:
            if d > 0 and self._readers[0] >= THREAD_READERS:
                return False
            self._readers[0] += d
            return True

    def __getitem__(self, request_id: Union[str, bytes]) -> bytes:
        """The key of ``request_id`` (raises KeyRevokedError / KeyNotFoundError)."""
        try:
            h, get, buf = self._local.st
        except AttributeError:
            h, get, buf = self._state()
        rid = request_id.encode() if request_id.__class__ is str else request_id
        n = get(h, rid) if 0 not in rid else -_TOO_SMALL  # NUL byte: the C string cannot carry it
        if n >= 0:
            return buf[:n]
        return self._get_slow(-n, rid)

    #: ``keys[request_id]`` as a method.
    get_bytes = __getitem__
    #: The ctypes get, whichever class handles' ``keys`` are (the extension hands it the ids of
    #: any type other than str and bytes, so both paths treat them alike).
    _get_ctypes = __getitem__

    def _get_slow(self, rc: int, rid: bytes) -> bytes:
        """The answer to a get whose fast call returned error code ``rc`` (called right after it,
        so the thread's last error is that call's): a key longer than the buffer (or an id with a
        NUL byte) is read again into a buffer of its size; any other code raises its exception."""
        if self._parent._h is None:
            self._parent.handle  # raises ClosedError
        if rc == _TOO_SMALL:  # a long key, or an id with a NUL byte
            n = c_size_t(0)
            rc = lib.shmsteer_key_get(self._parent.handle, rid, len(rid), None, 0, byref(n))
            if rc == _TOO_SMALL:
                big = ctypes.create_string_buffer(n.value + 1)
                rc = lib.shmsteer_key_get(self._parent.handle, rid, len(rid), big, len(big), byref(n))
                check(rc)
                return big.raw[: n.value]
            check(rc)
            return b""
        check(rc)
        raise AssertionError(f"shmsteer: a key get returned error code {rc} and no exception maps it")

    def __setitem__(self, request_id: Union[str, bytes], key: bytes) -> None:
        rid, kb = _id_bytes(request_id), _key_bytes(key)
        check(lib.shmsteer_key_set(self._parent.handle, rid, len(rid), kb, len(kb)))

    def __delitem__(self, request_id: Union[str, bytes]) -> None:
        self.revoke(request_id)

    def revoke(self, request_id: Union[str, bytes]) -> None:
        """Replace the key by the revoked sentinel (purged after the owner's grace period)."""
        rid = _id_bytes(request_id)
        check(lib.shmsteer_key_remove(self._parent.handle, rid, len(rid)))

    def entries(self) -> List[Tuple[str, bool]]:
        """(request id, revoked) for every id with a live key, and, in the owner only, every id
        whose revoked sentinel stands: sentinels are stored as hashes of the id, so only the
        owner, which schedules their purge, knows the ids. ``len()`` and iteration follow it."""
        return [(e["id"], e["revoked"]) for e in json.loads(_lib.read_json(lib.shmsteer_key_list_json, self._parent.handle))]

    def __iter__(self) -> Iterator[str]:
        return iter([i for i, _ in self.entries()])

    def __len__(self) -> int:
        return len(self.entries())

    def __contains__(self, request_id: object) -> bool:
        if not isinstance(request_id, (str, bytes)):
            return False
        try:
            self[request_id]
            return True
        except KeyNotFoundError:
            return False
        except KeyRevokedError:
            return True


def _load_fast() -> Tuple[Optional[Type[Keys]], str]:
    """(the extension's Keys class, "") or (None, why the ctypes get is used)."""
    _fastkeys, why = _lib.extension("_fastkeys", KEYS_CTYPES_ENV)
    if _fastkeys is None:
        return None, why
    if _fastkeys.KEY_BUFFER_BYTES != _lib.KEY_BUFFER_BYTES:
        return None, f"shmsteer._fastkeys was built for a key buffer of {_fastkeys.KEY_BUFFER_BYTES} bytes: rebuild it (go generate ./capi)"
    _fastkeys.bind(ctypes.cast(lib.shmsteer_reader_key_get, c_void_p).value,
                   ctypes.cast(lib.shmsteer_key_get, c_void_p).value)

    class _FastKeys(_fastkeys.KeysBase, Keys):  # type: ignore[misc]
        """:class:`Keys` whose ``keys[id]`` is the extension's C slot (KeysBase's, ahead of
        Keys.__getitem__ in the method order); everything else is Keys'."""

        __getitem__ = get_bytes = _fastkeys.KeysBase.__getitem__

    _FastKeys.__module__, _FastKeys.__qualname__ = __name__, "_FastKeys"
    return _FastKeys, ""


#: The class handles' ``keys`` are: the extension's when it is built and loads, else None.
_FastKeys, FAST_KEYS_REASON = _load_fast()
#: True when handles' ``keys[id]`` is the extension's get (``shmsteer._fastkeys``), False when it
#: is the ctypes one (:data:`FAST_KEYS_REASON` says why).
FAST_KEYS: bool = _FastKeys is not None


def new_keys(parent: "_Handle", fast: Optional[bool] = None) -> Keys:
    """A handle's Keys: the extension's get when ``fast`` (default: :data:`FAST_KEYS`), else the
    ctypes one. ``fast=True`` without the extension raises ImportError with the reason."""
    if fast is None:
        fast = FAST_KEYS
    if not fast:
        return Keys(parent)
    if _FastKeys is None:
        raise ImportError(f"shmsteer: the key get extension is not in use: {FAST_KEYS_REASON}")
    return _FastKeys(parent)


__all__ = ["Keys", "new_keys", "close_readers", "THREAD_READERS", "FAST_KEYS", "FAST_KEYS_REASON", "KEYS_CTYPES_ENV"]
