"""Activation capture consumers: read the hidden states workers capture, zero-copy.

A consumer attaches to the owner under a name the owner declares and reads every worker's
capture ring through the C ABI (``shmsteer_capture_*``; the ring's layout is the Go engine's,
never re-implemented here). :meth:`Consumer.next` returns one event at a time:

* :class:`Begin` -- a request captured for this consumer was admitted (its spec, prompt length);
  it comes before any of the request's records;
* :class:`Record` -- one site's rows of one request in one step, as numpy views of the ring's
  shared memory (``data``: ``rows x width``, float32 or float16, bfloat16 as a uint16 view with
  ``dtype == "bfloat16"``; ``positions``: uint32 absolute token positions), valid until the next
  call on the consumer (:meth:`Consumer.release` ends it earlier; copy what you keep);
* :class:`End` -- the request ended and all its records came before; publish the result then
  (:meth:`Consumer.publish`), which ``Owner.capture_result`` and serve's
  ``GET /v1/requests/{id}/capture`` return.

Example::

    from shmsteer.capture import Consumer, Record, End
    with Consumer("llm", "probe") as c:
        while True:
            ev = c.next(timeout=1.0)
            if isinstance(ev, Record):
                acts = ev.data.astype("float32") if ev.dtype != "bfloat16" else ev.data.copy()
            elif isinstance(ev, End):
                c.publish(ev.request_id, "ok", payload=[])

Many records at a time: :meth:`Consumer.next_run` returns a :class:`RecordRun` (records of one
ring, hook and shape: ``data`` one strided zero-copy view of shape ``(records, rows, width)``,
``layers``, ``request_ids`` and ``positions`` for all of them) in one library call, and
:meth:`Consumer.copy_run` copies a run's rows into a buffer of the caller's and releases them
at once (the fastest way to take rows out of the ring)::

    buf = np.empty(64 << 20, dtype=np.uint8)
    while True:
        ev = c.copy_run(buf, timeout=1.0)
        if isinstance(ev, RecordRun):
            acts = ev.data  # (records, rows, width), a view of buf until the next copy_run

A long-lived consumer outlives its owner with ``Consumer(..., follow=True)``: when the owner
stops, restarts or drops it, the next calls wait for the owner (returning None meanwhile) and
attach again, then return a :class:`Reattached` event (requests begun before it end without this
consumer: forget them).
"""

from __future__ import annotations

import ctypes
import json
import time
from ctypes import POINTER, Structure, byref, c_char_p, c_int, c_int32, c_int64, c_size_t, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

import numpy as np

from ._lib import check, lib
from .client import Owner, Secret, _b, _secret_args
from .errors import (AuthFailedError, AuthSecretNotDefinedError, BufferTooSmallError, CaptureConsumerNameError,
                     CapturePolicyError, CaptureRunTooLargeError, HubGoneError, InvalidArgumentError,
                     OwnerGoneError, SecretConflictError, SecretFileError, ShmsteerError, UnknownConsumerError)

__all__ = ["Consumer", "Begin", "Record", "RecordRun", "End", "Reattached", "Event", "CaptureClosedError",
           "FilesystemConsumer", "capture_result", "serve_capture", "BLOCK", "DROP"]

#: Backpressure policies: a worker waits up to the bound for a lagging consumer, then drops.
BLOCK = "block"
#: A worker drops a record at once when this consumer lags.
DROP = "drop"
#: Attach errors a following consumer does not wait out (as Go's capture.Follow): the owner
#: will not accept this consumer however long it waits.
_FATAL_ATTACH = (UnknownConsumerError, CapturePolicyError, CaptureConsumerNameError, AuthFailedError,
                 SecretFileError, SecretConflictError, AuthSecretNotDefinedError, InvalidArgumentError)
_POLICIES = {BLOCK: 1, DROP: 2}
_STATUSES = {"ok": 1, "partial_error": 2, "error": 3}
_DTYPES = {1: ("float32", np.float32), 2: ("bfloat16", np.uint16), 3: ("float16", np.float16)}
_U32 = np.dtype("<u4")


@dataclass(frozen=True)
class Reattached:
    """A following consumer (``Consumer(..., follow=True)``) attached again after the owner's
    capture hub closed its connection (the owner stopped, restarted or dropped the consumer).

    Requests whose :class:`Begin` came before it get no :class:`End` on this connection (the
    owner ended them without this consumer: forget their state); events after it are the new
    connection's. ``attachments`` counts the consumer's attachments (2 after the first
    re-attach)."""

    attachments: int


class _Event(Structure):
    _fields_ = [("kind", c_int32), ("ring", c_uint32), ("request_id", c_void_p), ("request_id_len", c_size_t),
                ("spec", c_void_p), ("spec_len", c_size_t), ("prompt_len", c_int64), ("dropped", c_uint64),
                ("layer", c_int32), ("dtype", c_int32), ("hook", c_void_p), ("hook_len", c_size_t),
                ("rows", c_int64), ("width", c_int64), ("positions", c_void_p), ("data", c_void_p),
                ("nbytes", c_size_t), ("ring_base", c_void_p), ("ring_len", c_size_t), ("data_off", c_size_t),
                ("positions_off", c_size_t), ("request_seq", c_uint32), ("hook_seq", c_uint32)]


class _Rec(Structure):
    _fields_ = [("request_seq", c_uint32), ("hook_seq", c_uint32), ("layer", c_int32), ("reserved", c_uint32),
                ("data_off", c_uint64), ("positions_off", c_uint64)]


# A run's shmsteer_capture_rec array as numpy reads it (one view per run, no per-record loop).
_REC_DTYPE = np.dtype([("request_seq", "<u4"), ("hook_seq", "<u4"), ("layer", "<i4"), ("reserved", "<u4"),
                       ("data_off", "<u8"), ("positions_off", "<u8")])
assert _REC_DTYPE.itemsize == ctypes.sizeof(_Rec)


class _Stats(Structure):
    _fields_ = [("rings", c_int64), ("received", c_uint64), ("dropped", c_uint64), ("skipped", c_uint64),
                ("lag", c_uint64)]


class _FSOptions(Structure):
    _fields_ = [("root", c_char_p), ("name", c_char_p), ("layout", c_char_p), ("policy", c_int32),
                ("bound_ns", c_int64), ("fsync", c_int32)]


class _FSStats(Structure):
    _fields_ = [("requests", c_uint64), ("ok", c_uint64), ("partial", c_uint64), ("failed", c_uint64),
                ("records", c_uint64), ("bytes", c_uint64)]


_h = c_void_p
for _name, (_res, _args) in {
    "shmsteer_capture_attach": (c_int, [c_char_p, c_char_p, c_size_t, c_char_p, c_char_p, c_int32, c_int64,
                                        POINTER(_h)]),
    "shmsteer_capture_next": (c_int, [_h, c_int64, POINTER(_Event)]),
    "shmsteer_capture_next_batch": (c_int, [_h, c_int64, POINTER(_Event), c_size_t, POINTER(c_size_t)]),
    "shmsteer_capture_next_run": (c_int, [_h, c_int64, POINTER(_Event), c_void_p, c_size_t, POINTER(c_size_t)]),
    "shmsteer_capture_copy_run": (c_int, [_h, c_int64, POINTER(_Event), c_void_p, c_size_t, POINTER(c_size_t), c_void_p,
                                          c_size_t, c_void_p, c_size_t]),
    "shmsteer_capture_release": (c_int, [_h]),
    "shmsteer_capture_publish": (c_int, [_h, c_char_p, c_size_t, c_int32, c_char_p, c_char_p, c_size_t]),
    "shmsteer_capture_stats_get": (c_int, [_h, POINTER(_Stats)]),
    "shmsteer_capture_close": (c_int, [_h]),
    "shmsteer_capture_serve": (c_int, [_h, c_char_p]),
    "shmsteer_capture_global": (c_int, [_h, c_char_p, c_size_t, c_char_p, c_size_t]),
    "shmsteer_capture_result_json": (c_int, [_h, c_char_p, c_size_t, c_void_p, c_size_t, POINTER(c_size_t)]),
    "shmsteer_capture_fs_start": (c_int, [c_char_p, c_char_p, c_size_t, c_char_p, POINTER(_FSOptions), POINTER(_h)]),
    "shmsteer_capture_fs_stop": (c_int, [_h, POINTER(_FSStats)]),
}.items():
    _fn = getattr(lib, _name)
    _fn.restype, _fn.argtypes = _res, _args


class CaptureClosedError(ShmsteerError, RuntimeError):
    """A call on a :class:`Consumer` after :meth:`Consumer.close`."""


@dataclass(frozen=True)
class Begin:
    """A request captured for this consumer was admitted: ``spec`` is this consumer's spec (the
    parsed JSON the request carried), ``prompt_len`` its prompt length."""

    request_id: str
    spec: Any
    prompt_len: int


class Record:
    """One site's captured rows of one request in one step.

    ``data`` (``rows x width``) and ``positions`` (``rows``, uint32) are read-only numpy views
    of the ring's shared memory, valid until the next call on the consumer; ``dtype`` names the
    element type: ``"float32"``, ``"float16"`` or ``"bfloat16"`` (then ``data`` is a uint16
    view of the raw elements; ``torch.from_numpy(data.copy()).view(torch.bfloat16)`` reads it).
    """

    __slots__ = ("request_id", "ring", "layer", "hook", "dtype", "positions", "data")

    def __init__(self, request_id: str, ring: int, layer: int, hook: str, dtype: str, positions: np.ndarray,
                 data: np.ndarray) -> None:
        self.request_id, self.ring, self.layer, self.hook = request_id, ring, layer, hook
        self.dtype, self.positions, self.data = dtype, positions, data

    def __repr__(self) -> str:
        return (f"Record(request_id={self.request_id!r}, ring={self.ring}, layer={self.layer}, hook={self.hook!r}, "
                f"dtype={self.dtype!r}, shape={self.data.shape})")


class RecordRun:
    """A run of records of one ring and one shape, read in one call (:meth:`Consumer.next_run`,
    :meth:`Consumer.copy_run`): ``len(run)`` records of ``rows x width`` elements of ``dtype``.

    ``data`` is one array of shape ``(len(run), rows, width)`` (record ``i`` is ``data[i]``;
    bfloat16 is a uint16 view with ``dtype == "bfloat16"``) and ``positions`` one of shape
    ``(len(run), rows)`` (uint32 absolute positions). ``hook`` is the run's hook; ``layers``
    (int32) and ``request_seqs`` (uint32: the consumer's numbers for the requests) are arrays
    of ``len(run)``, ``request_ids`` their names, a list of ``len(run)``.

    From :meth:`Consumer.next_run` ``data`` and ``positions`` are read-only strided views of the
    ring (zero copy) valid until the next call on the consumer; from
    :meth:`Consumer.copy_run` ``data`` is a view of the caller's buffer and ``positions`` an
    array of its own, and nothing refers to the ring.
    """

    __slots__ = ("ring", "hook", "dtype", "rows", "width", "data", "positions", "layers", "request_seqs",
                 "request_ids")

    def __init__(self, ring: int, hook: str, dtype: str, rows: int, width: int, data: np.ndarray,
                 positions: np.ndarray, layers: np.ndarray, request_seqs: np.ndarray, request_ids: List[str]) -> None:
        self.ring, self.hook, self.dtype, self.rows, self.width = ring, hook, dtype, rows, width
        self.data, self.positions, self.layers = data, positions, layers
        self.request_seqs, self.request_ids = request_seqs, request_ids

    def __len__(self) -> int:
        return len(self.layers)

    def record(self, i: int) -> Record:
        """Record ``i`` of the run, its arrays views of the run's."""
        return Record(self.request_ids[i], self.ring, int(self.layers[i]), self.hook, self.dtype,
                      self.positions[i], self.data[i])

    def __repr__(self) -> str:
        return (f"RecordRun(ring={self.ring}, hook={self.hook!r}, records={len(self)}, dtype={self.dtype!r}, "
                f"rows={self.rows}, width={self.width})")


@dataclass(frozen=True)
class End:
    """The request ended; every record of it came before. ``dropped`` counts the records
    dropped for this consumer while the request was open (publish ``partial_error`` then)."""

    request_id: str
    dropped: int


Event = Union[Begin, Record, End, Reattached]
RunEvent = Union[Begin, RecordRun, End, Reattached]


def _view(addr: int, n: int, dtype: Any, shape: tuple) -> np.ndarray:
    buf = (ctypes.c_char * n).from_address(addr)
    a = np.frombuffer(buf, dtype=dtype).reshape(shape)
    a.flags.writeable = False
    return a


class Consumer:
    """An attached capture consumer (``name`` must be one the owner declares).

    Args:
        namespace, secret, secret_file: as for :class:`shmsteer.Client`.
        name: the consumer's name.
        policy: :data:`BLOCK` (a worker's append waits for this consumer up to ``bound``, then
            drops the record) or :data:`DROP` (drops at once).
        bound: seconds a worker may wait for this consumer (0: the worker's own bound).
        follow: when the owner's hub closes the connection (the owner stops, restarts or drops
            this consumer), attach again instead of raising :class:`HubGoneError`, as Go's
            ``capture.Follow`` and ``shmsteer capture fs`` do: the ``next*`` and
            :meth:`copy_run` calls wait for the owner within their ``timeout`` (returning None,
            or an empty list, while it is away) and then return one :class:`Reattached` event.
            Attach errors that waiting cannot mend (an undeclared name, a bad policy, a wrong
            secret) still raise. The first attach, here, never waits.
        retry: seconds between attach attempts while following.

    Raises:
        UnknownConsumerError, ConsumerTakenError, NoHubError,
        CapturePolicyError (ValueError for a policy name not block or drop), and attach
        errors as for :class:`shmsteer.Client`.
    """

    def __init__(self, namespace: str, name: str, secret: Secret = None, secret_file: Optional[str] = None, *,
                 policy: str = BLOCK, bound: float = 0.0, follow: bool = False, retry: float = 0.2) -> None:
        if policy not in _POLICIES:
            raise ValueError(f"policy {policy!r}: want {BLOCK!r} or {DROP!r}")
        if not isinstance(bound, (int, float)) or bound < 0 or bound > 3600:
            raise ValueError(f"bound {bound!r}: want seconds in [0, 3600]")
        if not isinstance(retry, (int, float)) or not 0 < retry <= 60:
            raise ValueError(f"retry {retry!r}: want seconds in (0, 60]")
        sb, sl, sf = _secret_args(secret, secret_file)
        self._h: Optional[int] = None
        self._closed = False
        self._attach_args = (_b(namespace), sb, sl, sf, _b(name), _POLICIES[policy], int(bound * 1e9))
        self.name = name
        self.follow = bool(follow)
        self._retry = float(retry)
        #: How many times this consumer attached (1, then one more per :class:`Reattached`).
        self.attachments = 0
        self._ev = _Event()
        self._evref = byref(self._ev)
        self._batch: Optional[Any] = None  # next_batch's event array
        self._recs: Optional[np.ndarray] = None  # next_run's and copy_run's record array
        self._pos = np.empty(4096, dtype=_U32)  # copy_run's positions (grown when a run needs more)
        self._attach()

    def _attach(self) -> None:
        out = c_void_p()
        check(lib.shmsteer_capture_attach(*self._attach_args, byref(out)))
        self._h = out.value
        self.attachments += 1
        # A connection's numbering and mappings are its own (capi starts them afresh).
        self._reqs: Dict[int, str] = {}    # request_seq -> request id, from its begin to its end
        self._hooks: Dict[int, str] = {}   # hook_seq -> hook name
        self._rings: Dict[int, Any] = {}   # ring id -> (base address, uint8 view of its data area)

    def _handle(self) -> int:
        if self._h is None:
            if not self._closed:
                raise HubGoneError("shmsteer: the owner's capture hub is gone; the next event call attaches again")
            raise CaptureClosedError("shmsteer: capture consumer closed")
        return self._h

    def _detached(self) -> bool:
        """Whether a following consumer lost its connection and has not attached again."""
        if self._h is None and self._closed:
            raise CaptureClosedError("shmsteer: capture consumer closed")
        return self._h is None

    def _lost(self, rc: int) -> None:
        """Raise rc's error, unless it says a following consumer's hub is gone: then drop the
        dead connection (the next call attaches again)."""
        try:
            check(rc)
        except (HubGoneError, OwnerGoneError):
            if not self.follow:
                raise
            h, self._h = self._h, None
            try:
                lib.shmsteer_capture_close(h)
            except Exception:  # pragma: no cover - the connection is gone either way
                pass

    def _reattach(self, timeout: float) -> Optional[Reattached]:
        """Attach a following consumer again within timeout seconds: the Reattached event, or
        None while the owner does not accept it (the next call tries again)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._attach()
                return Reattached(self.attachments)
            except _FATAL_ATTACH:
                raise
            except ShmsteerError:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                time.sleep(min(self._retry, left))

    def next(self, timeout: float = 1.0) -> Optional[Event]:
        """The next event, waiting at most ``timeout`` seconds (None: none came). Releases the
        records the previous call returned (their views must not be used any more)."""
        if not isinstance(timeout, (int, float)) or timeout < 0:
            raise ValueError(f"timeout {timeout!r}: want seconds >= 0")
        if self._detached():
            return self._reattach(timeout)
        rc = lib.shmsteer_capture_next(self._handle(), int(timeout * 1000), self._evref)
        if rc:
            self._lost(rc)
            return self._reattach(timeout)
        return self._decode(self._ev)

    def next_batch(self, max_events: int = 256, timeout: float = 1.0) -> List[Event]:
        """Up to ``max_events`` events at once (empty: none within ``timeout``): the first as
        :meth:`next` returns it, then, if it is a :class:`Record`, the records that follow it.
        Every record's views stay valid until the next call on the consumer (the worker cannot
        reuse their ring space meanwhile: keep batches small against the ring). One call into
        the library per batch, where :meth:`next` makes one per event."""
        if not isinstance(max_events, int) or not 1 <= max_events <= 65536:
            raise ValueError(f"max_events {max_events!r}: want an int in [1, 65536]")
        if not isinstance(timeout, (int, float)) or timeout < 0:
            raise ValueError(f"timeout {timeout!r}: want seconds >= 0")
        if self._detached():
            ev = self._reattach(timeout)
            return [ev] if ev else []
        if self._batch is None or len(self._batch) < max_events:
            self._batch = (_Event * max_events)()
        n = c_size_t(0)
        rc = lib.shmsteer_capture_next_batch(self._handle(), int(timeout * 1000), self._batch, max_events, byref(n))
        if rc:
            self._lost(rc)
            ev = self._reattach(timeout)
            return [ev] if ev else []
        batch, decode = self._batch, self._decode
        return [decode(batch[i]) for i in range(n.value)]

    def _run_recs(self, max_records: int) -> Any:
        if not isinstance(max_records, int) or isinstance(max_records, bool) or not 1 <= max_records <= 65536:
            raise ValueError(f"max_records {max_records!r}: want an int in [1, 65536]")
        if self._recs is None or len(self._recs) < max_records:
            self._recs = np.zeros(max_records, dtype=_REC_DTYPE)
        return self._recs

    def next_run(self, max_records: int = 1024, timeout: float = 1.0) -> Optional[RunEvent]:
        """The next event, with a record's run in one call: a :class:`Begin` or :class:`End` as
        :meth:`next` gives them, or a :class:`RecordRun` of up to ``max_records`` records (the
        next record and those after it in its ring with its hook and shape, at one stride in
        the ring:
        ``data`` is one strided zero-copy view of them), None when nothing came within
        ``timeout`` seconds.

        The run's views are valid until the next call on the consumer. After that (or
        :meth:`release`) the worker may overwrite the ring under them at any time: reading an
        old run's ``data`` then returns whatever was written since (no error); after
        :meth:`close` the ring is unmapped and reading them is undefined (it may crash the
        process). Copy what you keep, or use :meth:`copy_run`.
        """
        if not isinstance(timeout, (int, float)) or timeout < 0:
            raise ValueError(f"timeout {timeout!r}: want seconds >= 0")
        recs = self._run_recs(max_records)
        if self._detached():
            return self._reattach(timeout)
        n = c_size_t(0)
        ev = self._ev
        rc = lib.shmsteer_capture_next_run(self._handle(), int(timeout * 1000), self._evref, recs.ctypes.data,
                                           max_records, byref(n))
        if rc:
            self._lost(rc)
            return self._reattach(timeout)
        if ev.kind != 2:
            return self._decode(ev)
        k = n.value
        rs = recs[:k]
        mem = self._ring_mem(ev)
        name, np_dtype = _DTYPES[ev.dtype]
        rows, width, isz = ev.rows, ev.width, np.dtype(np_dtype).itemsize
        first = int(rs[0]["data_off"])
        stride = int(rs[1]["data_off"]) - first if k > 1 else ev.nbytes
        data = np.ndarray((k, rows, width), dtype=np_dtype, buffer=mem, offset=first,
                          strides=(stride, width * isz, isz))
        positions = np.ndarray((k, rows), dtype=_U32, buffer=mem, offset=int(rs[0]["positions_off"]),
                               strides=(stride, 4))
        data.flags.writeable = False
        positions.flags.writeable = False
        return self._run(ev, rs, name, data, positions)

    def copy_run(self, dst: np.ndarray, max_records: int = 1024, timeout: float = 1.0) -> Optional[RunEvent]:
        """:meth:`next_run`, copying the run's rows into ``dst`` (a writable C-contiguous array
        of any dtype, used as bytes): the run's ``data`` is a view of ``dst``'s first bytes,
        its ``positions`` an array of its own. The run may span the ring's wrap-around, is at
        most ``dst.nbytes`` bytes, and its records are released before this returns: nothing
        of the run refers to the ring. Large runs are copied with non-temporal stores.

        Raises:
            CaptureRunTooLargeError when the next record alone is larger than ``dst`` (nothing
            consumed; its ``need`` attribute is the bytes it needs); ValueError for a ``dst``
            that is not a writable C-contiguous numpy array.
        """
        if not isinstance(timeout, (int, float)) or timeout < 0:
            raise ValueError(f"timeout {timeout!r}: want seconds >= 0")
        if not isinstance(dst, np.ndarray) or not dst.flags.c_contiguous or not dst.flags.writeable or dst.nbytes < 1:
            raise ValueError("dst: want a non-empty writable C-contiguous numpy array")
        recs = self._run_recs(max_records)
        if self._detached():
            return self._reattach(timeout)
        n = c_size_t(0)
        ev = self._ev
        while True:
            pos = self._pos
            rc = lib.shmsteer_capture_copy_run(self._handle(), int(timeout * 1000), self._evref, recs.ctypes.data,
                                               max_records, byref(n), dst.ctypes.data, dst.nbytes, pos.ctypes.data,
                                               len(pos))
            if rc == CaptureRunTooLargeError.code and ev.nbytes <= dst.nbytes:
                # The positions buffer is what is short: grow it and read the run again.
                self._pos = np.empty(max(2 * len(pos), int(ev.rows)), dtype=_U32)
                continue
            if rc:
                try:
                    self._lost(rc)
                except CaptureRunTooLargeError as e:
                    e.need = int(ev.nbytes)
                    raise
                return self._reattach(timeout)
            break
        if ev.kind != 2:
            return self._decode(ev)
        k = n.value
        name, np_dtype = _DTYPES[ev.dtype]
        rows, width = ev.rows, ev.width
        data = dst.reshape(-1).view(np.uint8)[:k * ev.nbytes].view(np_dtype).reshape(k, rows, width)
        positions = pos[:k * rows].reshape(k, rows).copy()
        return self._run(ev, recs[:k], name, data, positions)

    def _ring_mem(self, ev: _Event) -> np.ndarray:
        view = self._rings.get(ev.ring)
        if view is None or view[0] != ev.ring_base:
            # The ring's data area mapped once; records are slices of it.
            view = self._rings[ev.ring] = (ev.ring_base, _view(ev.ring_base, ev.ring_len, np.uint8, (ev.ring_len,)))
        return view[1]

    def _run(self, ev: _Event, rs: np.ndarray, name: str, data: np.ndarray, positions: np.ndarray) -> RecordRun:
        # The first record's names come with ev (the run shares its hook).
        reqs, hooks = self._reqs, self._hooks
        if ev.request_seq not in reqs:
            reqs[ev.request_seq] = ctypes.string_at(ev.request_id, ev.request_id_len).decode("utf-8", "replace")
        hook = hooks.get(ev.hook_seq)
        if hook is None:
            hook = hooks[ev.hook_seq] = ctypes.string_at(ev.hook, ev.hook_len).decode()
        rseq = rs["request_seq"].copy()
        return RecordRun(ev.ring, hook, name, ev.rows, ev.width, data, positions, rs["layer"].copy(), rseq,
                         list(map(reqs.__getitem__, rseq.tolist())))

    def _decode(self, ev: _Event) -> Optional[Event]:
        kind = ev.kind
        if kind == 2:
            rid = self._reqs.get(ev.request_seq)
            if rid is None:
                rid = self._reqs[ev.request_seq] = ctypes.string_at(ev.request_id, ev.request_id_len).decode(
                    "utf-8", "replace")
            hook = self._hooks.get(ev.hook_seq)
            if hook is None:
                hook = self._hooks[ev.hook_seq] = ctypes.string_at(ev.hook, ev.hook_len).decode()
            ring = ev.ring
            view = self._rings.get(ring)
            if view is None or view[0] != ev.ring_base:
                # The ring's data area mapped once; records are slices of it.
                view = self._rings[ring] = (ev.ring_base, _view(ev.ring_base, ev.ring_len, np.uint8, (ev.ring_len,)))
            mem = view[1]
            name, np_dtype = _DTYPES[ev.dtype]
            rows = ev.rows
            o = ev.data_off
            data = mem[o:o + ev.nbytes].view(np_dtype).reshape(rows, ev.width)
            o = ev.positions_off
            pos = mem[o:o + 4 * rows].view(_U32)
            return Record(rid, ring, ev.layer, hook, name, pos, data)
        if kind == 0:
            return None
        rid = ctypes.string_at(ev.request_id, ev.request_id_len).decode("utf-8", "replace")
        if kind == 1:
            spec = json.loads(ctypes.string_at(ev.spec, ev.spec_len)) if ev.spec_len else None
            self._reqs[ev.request_seq] = rid
            return Begin(rid, spec, int(ev.prompt_len))
        self._reqs.pop(ev.request_seq, None)
        return End(rid, int(ev.dropped))

    def release(self) -> None:
        """Let the worker reuse the records :meth:`next` or :meth:`next_batch` returned (they do
        it too)."""
        check(lib.shmsteer_capture_release(self._handle()))

    def publish(self, request_id: str, status: str, error: Optional[str] = None,
                payload: Optional[List[Any]] = None) -> None:
        """Publish this consumer's result for a request (after its :class:`End`): ``status``
        ``"ok"``, ``"partial_error"`` or ``"error"``, an error message, a JSON-serializable list
        as the payload (the filesystem consumer's: the paths it wrote).

        Raises:
            ValueError for another status or a payload that is not a list; CaptureResultError.
        """
        if status not in _STATUSES:
            raise ValueError(f"status {status!r}: want one of {sorted(_STATUSES)}")
        if payload is not None and not isinstance(payload, list):
            raise ValueError("payload must be a list")
        rid = _b(request_id)
        pl = json.dumps(payload if payload is not None else []).encode()
        check(lib.shmsteer_capture_publish(self._handle(), rid, len(rid), _STATUSES[status],
                                           _b(error) if error else None, pl, len(pl)))

    def stats(self) -> Dict[str, int]:
        """Counters: ``rings`` read, records ``received``, ``dropped`` while it lagged,
        ``skipped`` (requests not captured for it), ``lag`` (most unreleased bytes on a ring)."""
        s = _Stats()
        check(lib.shmsteer_capture_stats_get(self._handle(), byref(s)))
        return {"rings": s.rings, "received": s.received, "dropped": s.dropped, "skipped": s.skipped, "lag": s.lag}

    def close(self) -> None:
        """Detach (requests it has not published end with status ``error``). Idempotent."""
        self._closed = True
        if self._h is not None:
            h, self._h = self._h, None
            check(lib.shmsteer_capture_close(h))

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class FilesystemConsumer:
    """The filesystem consumer (what ``shmsteer capture fs`` runs) on threads of the library in
    this process: attached to the owner as ``name``, it writes each captured request under
    ``root/{tag}/{request_id}/`` in the vLLM fork's layout (per_file ``{layer}_{hook}.bin`` and
    ``.json`` sidecars, or ``packed.bin`` and ``packed.json``; ``layout`` for specs that name
    none) and publishes the paths it wrote as the request's result (:func:`capture_result`).
    When the owner restarts or drops it, it attaches again. For a process without the
    ``shmsteer`` command (the vLLM plugin's engine process runs one for
    ``SHMSTEER_VLLM_CAPTURE_DIR``).

    Args:
        namespace, secret, secret_file: as for :class:`shmsteer.Client`.
        root: the directory the files go under (created; ``.tmp`` files a killed consumer left
            there are removed first).
        name, policy, bound: as for :class:`Consumer`.
        layout: ``"per_file"`` or ``"packed"``.
        fsync: fsync each file and its directory before publishing it.

    Raises:
        CaptureLayoutError, CapturePolicyError, CaptureWriteError (``root`` cannot be made),
        and :class:`Consumer`'s attach errors (UnknownConsumerError, ConsumerTakenError,
        NoHubError, ...); ValueError for a policy name or bound out of range.
    """

    def __init__(self, namespace: str, root: str, secret: Secret = None, secret_file: Optional[str] = None, *,
                 name: str = "fs", layout: str = "per_file", policy: str = BLOCK, bound: float = 0.0,
                 fsync: bool = True) -> None:
        if policy not in _POLICIES:
            raise ValueError(f"policy {policy!r}: want {BLOCK!r} or {DROP!r}")
        if not isinstance(bound, (int, float)) or bound < 0 or bound > 3600:
            raise ValueError(f"bound {bound!r}: want seconds in [0, 3600]")
        sb, sl, sf = _secret_args(secret, secret_file)
        opt = _FSOptions(_b(root), _b(name), _b(layout), _POLICIES[policy], int(bound * 1e9), int(bool(fsync)))
        out = c_void_p()
        self._h: Optional[int] = None
        check(lib.shmsteer_capture_fs_start(_b(namespace), sb, sl, sf, byref(opt), byref(out)))
        self._h = out.value
        self.root, self.name = root, name
        #: The counters :meth:`stop` returned (None while it runs).
        self.stats: Optional[Dict[str, int]] = None

    def stop(self) -> Dict[str, int]:
        """Stop (requests not ended are abandoned) and return the counters: ``requests``, their
        results ``ok``, ``partial``, ``failed``, and the ``records`` and ``bytes`` written.
        Idempotent: later calls return the same counters.

        Raises:
            the error that stopped the consumer earlier, if one did (a secret the owner refused
            on re-attaching, say).
        """
        if self._h is None:
            return dict(self.stats or {})
        h, self._h = self._h, None
        st = _FSStats()
        rc = lib.shmsteer_capture_fs_stop(h, byref(st))
        self.stats = {k: int(getattr(st, k)) for k, _ in _FSStats._fields_}
        check(rc)
        return dict(self.stats)

    def __enter__(self) -> "FilesystemConsumer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __del__(self) -> None:
        try:
            self.stop()
        except Exception:
            pass


def serve_capture(owner: Owner, consumers: Dict[str, str], global_specs: Optional[Dict[str, Any]] = None) -> None:
    """Make a Python-hosted :class:`shmsteer.Owner` serve capture consumers, declared as
    ``{name: type}`` (type ``"filesystem"``), with ``global_specs`` (``{name: spec}``) the
    declared consumers' global specs: every request admitted without naming such a consumer is
    captured for it with its global spec (a request's own spec replaces it; serve's
    ``--capture-global``). A filesystem global spec is its ``FilesystemCaptureRequest`` without
    ``request_id``: each request is written under its own id. A request it cannot apply to (no
    ``prompt_len`` for a prompt selector, say) is admitted, that consumer's result ``error`` and
    ``"global": true`` in :func:`capture_result`.

    Raises:
        ValueError for an empty declaration, TypeError for a name or type not a str;
        CaptureConsumerNameError (a bad name, too many), CaptureConsumerTypeError (an unknown
        type), InvalidArgumentError (the owner serves capture already); for a bad global spec
        the typed error a request's spec gets (CaptureSpecError, CaptureHookError, ...), the
        specs given before it kept.
    """
    if not consumers:
        raise ValueError("declare at least one consumer")
    for n, t in consumers.items():
        if not isinstance(n, str) or not isinstance(t, str):
            raise TypeError(f"capture consumer {n!r}={t!r}: want str names and types")
        if any(c in n for c in ",= \t\n") or not n:
            # The declaration list is "NAME=TYPE,...": such a name would be read as another.
            raise CaptureConsumerNameError(f"shmsteer: capture consumer name {n!r}: want [a-zA-Z0-9._-]+")
    decl = ",".join(f"{n}={t}" for n, t in consumers.items())
    check(lib.shmsteer_capture_serve(owner.handle, decl.encode()))
    for name, spec in (global_specs or {}).items():
        n, js = _b(name), json.dumps(spec).encode()
        check(lib.shmsteer_capture_global(owner.handle, n, len(n), js, len(js)))


def capture_result(owner: Owner, request_id: str) -> Dict[str, Dict[str, Any]]:
    """Every declared consumer's result for a request: ``{consumer: {"status": "pending" |
    "ok" | "partial_error" | "error" | "not_requested", "error": str or None, "payload": [...]}}``,
    final once the request ended and the consumer published.

    Raises:
        NoHubError if the owner serves no capture.
    """
    rid = _b(request_id)
    n = c_size_t(0)
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        try:
            check(lib.shmsteer_capture_result_json(owner.handle, rid, len(rid), buf, size, byref(n)))
        except BufferTooSmallError:
            size = n.value
            continue
        return json.loads(buf.raw[:n.value])



