"""Stepper: steer.Stepper over the caller's float32 rows (begin, apply per hook and layer, end),
and what it hands out: spans, Effective, StepperBusyError. Made by ``handle.stepper()`` on a
:class:`~shmsteer.Client` or :class:`~shmsteer.Owner`; ``shmsteer.client`` re-exports these names.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import weakref
from ctypes import byref, c_uint64, c_void_p
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple, Union

from . import _lib
from ._common import I32, I64, PHASES, U32, U64, _int, _quiet_close
from ._lib import check, lib
from .errors import InvalidArgumentError, ShmsteerError

if TYPE_CHECKING:
    from .client import _Handle

try:  # numpy is optional: apply() then takes torch tensors only
    import numpy as _np
except ImportError:  # pragma: no cover - exercised only where numpy is missing
    _np = None


@dataclass
class Effective:
    """A request's effective steering at one (hook, layer, phase) in the current step.

    A row gets the request's composed vector (``data_ptr``) plus the global composed vector
    (``global_ptr``) added, each only if not 0, then ``clamps`` clamps. Both point into the
    shared read-only mapping (the owner composes once; zero bytes copied) and are valid until
    the next begin()/end(); :meth:`array` returns their sum as a new array. ``digest`` changes
    exactly when the floats do."""

    data_ptr: int
    global_ptr: int
    length: int
    clamps: int
    version: int
    digest: bytes

    def array(self) -> Any:
        """A float32 copy of what a row gets added (request + global), or None."""
        parts = [p for p in (self.data_ptr, self.global_ptr) if p]
        if not parts:
            return None
        views = [(ctypes.c_float * self.length).from_address(p) for p in parts]
        if _np is None:
            return [sum(x) for x in zip(*views)]
        out = _np.frombuffer(bytes(views[0]), dtype=_np.float32).copy()
        for v in views[1:]:
            out += _np.frombuffer(bytes(v), dtype=_np.float32)
        return out


#: A span: (request id, start, end, phase) or (request id, start, end, phase, first_position),
#: first_position the absolute token position of row start (the request's tokens computed
#: before this step; 0 when left out), which capture's position selectors read.
SpanLike = Union[Tuple[str, int, int, Union[int, str]], Tuple[str, int, int, Union[int, str], int]]


def span_fields(i: int, span: Any) -> Tuple[Any, Any, Any, Any, Any]:
    """A 4- or 5-tuple span's fields, first_position 0 for a 4-tuple; InvalidArgumentError for
    another length."""
    try:
        n = len(span)
    except TypeError:
        n = -1
    if n == 4:
        rid, start, end, phase = span
        return rid, start, end, phase, 0
    if n == 5:
        return tuple(span)  # type: ignore[return-value]
    raise InvalidArgumentError(f"shmsteer: invalid argument: span {i} must be (id, start, end, phase[, first_position])")


class StepperBusyError(ShmsteerError, RuntimeError):
    """A :class:`Stepper` was called while another thread was inside one of its calls. A
    Stepper (its step state, its pinned version) is for one thread at a time: make one per
    thread with ``handle.stepper()``. Raised before anything is done; the other call is
    unaffected."""


class Stepper:
    """steer.Stepper over the caller's float32 rows: begin(), apply() per (hook, layer), end().

    One thread at a time: a call made while another thread is inside one, or while another
    thread's step is open (from its begin() to its end()), raises :class:`StepperBusyError` (the
    engine's step state is not shared safely between threads)."""

    def __init__(self, parent: _Handle) -> None:
        out = c_void_p()
        check(lib.shmsteer_stepper_new(parent.handle, byref(out)))
        self._parent = parent
        self._h: Optional[int] = out.value
        self._final = weakref.finalize(self, _quiet_close, lib.shmsteer_stepper_free, out.value)
        self._ids: Dict[str, bytes] = {}
        self._busy = threading.Lock()  # held during each call
        self._step_thread: Optional[int] = None  # the thread whose step is open (begin to end)
        self._strict = False
        self._end_out = c_uint64()  # end()'s out-parameter, made once (each call holds _busy)
        self._end_ptr = ctypes.pointer(self._end_out)
        #: end()'s call without ctypes: ``end(handle) -> (error code, checksum)``, the
        #: ``shmsteer._faststep`` extension's, which the native hooks set; None: ctypes.
        self._fast_end: Any = None

    @property
    def strict(self) -> bool:
        """True: apply, bind and resolve raise :class:`~shmsteer.errors.UnknownRequestError`
        for a span naming a request with no admitted entry, and change nothing; False (the
        default): its rows get the global steering only, counted in ``stats()["unknown_requests"]``.
        Set it between steps."""
        return self._strict

    @strict.setter
    def strict(self, on: bool) -> None:
        h = self._enter("strict")
        try:
            check(lib.shmsteer_stepper_set_strict(h, 1 if on else 0))
            self._strict = bool(on)
        finally:
            self._busy.release()

    def _enter(self, what: str) -> int:
        """Take the stepper for this call (StepperBusyError if another thread holds it) and
        return its handle; the caller releases ``self._busy``."""
        if not self._busy.acquire(blocking=False):
            raise StepperBusyError(f"shmsteer: stepper busy: {what} called while another thread is inside a "
                                   "call of this Stepper; use one Stepper per thread (handle.stepper())")
        if self._step_thread is not None and self._step_thread != threading.get_ident():
            self._busy.release()
            raise StepperBusyError(f"shmsteer: stepper busy: {what} called while another thread's step is "
                                   "open (begin() to end()); use one Stepper per thread (handle.stepper())")
        if self._h is None:
            self._busy.release()
            from .errors import ClosedError
            raise ClosedError("shmsteer: stepper closed")
        return self._h

    def close(self) -> None:
        if self._h is None:
            return
        self._enter("close()")
        try:
            self._h = None
            self._final()
        finally:
            self._busy.release()

    def __enter__(self) -> "Stepper":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def handle(self) -> int:
        if self._h is None:
            from .errors import ClosedError
            raise ClosedError("shmsteer: stepper closed")
        return self._h

    def begin(self, version: int = 0) -> int:
        """Start a step at ``version`` (0: current); returns the pinned version."""
        v = c_uint64()
        version = _int("version", version, U64)
        h = self._enter("begin()")
        try:
            check(lib.shmsteer_stepper_begin(h, version, byref(v)))
            self._step_thread = threading.get_ident()
        finally:
            self._busy.release()
        return v.value

    def stats(self) -> Dict[str, Any]:
        """The stepper's counters (steer.StepStats): steps, applies, recomposes, missing_refs,
        unknown_requests, gate_evaluations, gate_fires, gate_reports_missed, ``gate_scopes``
        ({scope: {evaluations, fires, engaged}}) and ``gate_checksum``, the gate decisions of the
        current or last step (the same for a native step and a device-path step)."""
        out = _lib.StepStats()
        h = self._enter("stats()")
        try:
            check(lib.shmsteer_stepper_stats(h, byref(out)))
        finally:
            self._busy.release()
        d: Dict[str, Any] = {f: getattr(out, f) for f, _ in out._fields_ if f != "gate_scopes"}
        d["gate_scopes"] = {scope: dict(zip(("evaluations", "fires", "engaged"), out.gate_scopes[i]))
                            for i, scope in enumerate(("this_token", "next_step", "rest_of_request", "rest_of_conversation"))}
        return d

    def report_gates(self, worker: str) -> None:
        """Send this stepper's gate counts (cumulative) to the owner as ``worker`` (e.g. "rank0"):
        serve sums its workers' reports into its status and metrics. Under tensor parallelism
        report from one rank. :class:`~shmsteer.errors.NotServedError` from an owner that does not
        collect them, or in the owner's own process."""
        b = worker.encode()
        h = self._enter("report_gates()")
        try:
            check(lib.shmsteer_stepper_report_gates(h, b, len(b)))
        finally:
            self._busy.release()

    def end(self) -> int:
        """End the step; returns its determinism checksum."""
        h = self._enter("end()")
        try:
            self._step_thread = None
            fast = self._fast_end
            if fast is not None:
                rc, checksum = fast(h)
                if rc:
                    check(rc)
                return checksum
            check(lib.shmsteer_stepper_end(h, self._end_ptr))
            return self._end_out.value
        finally:
            self._busy.release()

    def _id(self, rid: str) -> bytes:
        b = self._ids.get(rid)
        if b is None:
            if len(self._ids) > 4096:
                self._ids.clear()
            b = self._ids[rid] = rid.encode()
        return b

    def spans(self, spans: Sequence[SpanLike]) -> ctypes.Array:
        """Pack (request id, start, end, phase[, first_position]) spans for :meth:`apply_ptr`."""
        arr = (_lib.Span * len(spans))()
        for i, sp in enumerate(spans):
            rid, start, end, phase, pos = span_fields(i, sp)
            b = self._id(rid)
            arr[i] = _lib.Span(b, len(b), _int(f"span {i} start", start, I64), _int(f"span {i} end", end, I64),
                               PHASES[phase], _int(f"span {i} first_position", pos, I32))
        return arr

    def capture_start(self, rank: int = 0, writer_rank: int = 0, ring_bytes: int = 0, wait: float = 0.0) -> None:
        """Capture at this stepper's applies (and its batches' captures) the rows admitted
        requests ask for, into a capture ring of its own registered with the owner's hub
        (consumers read it: :mod:`shmsteer.capture`). Under tensor parallelism only
        ``writer_rank`` captures: another ``rank`` makes no ring. ``ring_bytes`` 0: 64 MiB;
        ``wait``: the longest a record waits for a lagging block consumer, in seconds (0: 10 ms).

        Raises:
            NoHubError when the owner serves no capture; InvalidArgumentError for a negative
            rank or wait.
        """
        if wait < 0:
            raise InvalidArgumentError("shmsteer: invalid argument: wait must not be negative")
        o = _lib.CaptureOptionsC(_int("ring_bytes", ring_bytes, U64), int(wait * 1e9), _int("rank", rank, I32),
                                 _int("writer_rank", writer_rank, I32))
        h = self._enter("capture_start()")
        try:
            check(lib.shmsteer_stepper_capture_start(h, byref(o)))
        finally:
            self._busy.release()

    def capture_stop(self) -> None:
        """Stop capturing; the ring is closed."""
        h = self._enter("capture_stop()")
        try:
            check(lib.shmsteer_stepper_capture_stop(h))
        finally:
            self._busy.release()

    def capture_ptr(self, hook: int, layer: int, ptr: int, n_bytes: int, dtype: int, spans: ctypes.Array) -> None:
        """Capture (hook, layer)'s rows of the n_bytes at ptr (dtype CAPTURE_F32, _BF16 or
        _F16 elements, row-major tokens x hidden), before they are steered."""
        hook, layer = _int("hook id", hook, U32), _int("layer", layer, I32)
        h = self._enter("capture()")
        try:
            check(lib.shmsteer_stepper_capture(h, hook, layer, ptr, _int("n_bytes", n_bytes, U64), dtype, spans, len(spans)))
        finally:
            self._busy.release()

    def apply_ptr(self, hook: int, layer: int, ptr: int, n_floats: int, spans: ctypes.Array) -> None:
        """Apply over n_floats float32 at address ptr (in place, no copy)."""
        hook, layer = _int("hook id", hook, U32), _int("layer", layer, I32)
        n_floats = _int("n_floats", n_floats, U64)
        h = self._enter("apply()")
        try:
            check(lib.shmsteer_stepper_apply(h, hook, layer, ptr, n_floats, spans, len(spans)))
        finally:
            self._busy.release()

    def apply(self, hook: Union[str, int], layer: int, rows: Any, spans: Sequence[SpanLike]) -> None:
        """Add each span's effective steering to its rows of ``rows`` in place.

        ``rows``: a C-contiguous, writeable float32 numpy array or CPU torch tensor of shape
        [tokens, hidden] (any shape whose size is tokens*hidden). The native kernels run on its
        own memory: nothing is copied.
        """
        ptr, n = _rows_ptr(rows)
        self.apply_ptr(self._parent.hook_id(hook), layer, ptr, n, self.spans(spans))

    def bind(self, spans: Union[Sequence[SpanLike], ctypes.Array], n_rows: int) -> None:
        """Bind ``spans`` (as :meth:`apply` takes them, or packed by :meth:`spans`), the batch of
        a block of ``n_rows`` rows, as this step's batch for :meth:`apply_bound`: validated once
        and copied. It lasts until :meth:`end`, the next bind, or an apply with other spans.

        Raises:
            BadBatchError or ShapeError (no batch is bound then); NoStepError outside a step.
        """
        arr = spans if isinstance(spans, ctypes.Array) else self.spans(spans)
        n_rows = _int("n_rows", n_rows, U64)
        h = self._enter("bind()")
        try:
            check(lib.shmsteer_stepper_bind(h, arr, len(arr), n_rows))
        finally:
            self._busy.release()

    def apply_bound_ptr(self, hook: int, layer: int, ptr: int, n_floats: int) -> None:
        """:meth:`apply_bound` over n_floats float32 at address ptr (in place, no copy)."""
        hook, layer = _int("hook id", hook, U32), _int("layer", layer, I32)
        n_floats = _int("n_floats", n_floats, U64)
        h = self._enter("apply_bound()")
        try:
            check(lib.shmsteer_stepper_apply_bound(h, hook, layer, ptr, n_floats))
        finally:
            self._busy.release()

    def apply_bound(self, hook: Union[str, int], layer: int, rows: Any) -> None:
        """:meth:`apply` with the batch bound by :meth:`bind`, which is neither packed nor
        compared again: ``rows`` must be the bound block (n_rows x hidden float32, as
        :meth:`apply` takes it). The same floats and checksum as :meth:`apply`.

        Raises:
            ShapeError for another block size; NoStepError when no batch is bound.
        """
        ptr, n = _rows_ptr(rows)
        self.apply_bound_ptr(self._parent.hook_id(hook), layer, ptr, n)

    def effective(self, request_id: str, hook: Union[str, int], layer: int,
                  phase: Union[int, str]) -> Effective:
        """The request's effective steering at (hook, layer, phase) in this step."""
        out = _lib.EffectiveC()
        b = self._id(request_id)
        hid, layer = self._parent.hook_id(hook), _int("layer", layer, I32)
        h = self._enter("effective()")
        try:
            check(lib.shmsteer_stepper_effective(h, b, len(b), hid, layer, PHASES[phase], byref(out)))
        finally:
            self._busy.release()
        ptr = ctypes.cast(out.data, c_void_p).value or 0
        gptr = ctypes.cast(out.global_data, c_void_p).value or 0
        return Effective(ptr, gptr, out.len, out.clamps, out.version, bytes(out.digest))


def _rows_ptr(rows: Any) -> Tuple[int, int]:
    """Address and float count of writeable, contiguous float32 rows."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(rows, torch.Tensor):
        if rows.dtype != torch.float32:
            raise TypeError(f"shmsteer: rows must be float32, not {rows.dtype}")
        if rows.device.type != "cpu":
            raise ValueError("shmsteer: apply() runs on CPU tensors; use the device path for CUDA")
        if not rows.is_contiguous():
            raise ValueError("shmsteer: rows tensor is not contiguous")
        return rows.data_ptr(), rows.numel()
    if _np is not None and isinstance(rows, _np.ndarray):
        if rows.dtype != _np.float32:
            raise TypeError(f"shmsteer: rows must be float32, not {rows.dtype}")
        if not rows.flags.c_contiguous or not rows.flags.writeable:
            raise ValueError("shmsteer: rows must be C-contiguous and writeable")
        return rows.ctypes.data, rows.size
    raise TypeError(f"shmsteer: rows must be a numpy array or torch tensor, not {type(rows).__name__}")


__all__ = ["Stepper", "StepperBusyError", "Effective", "SpanLike", "span_fields"]
