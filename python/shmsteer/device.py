"""The per-step batch and the device tables it keeps current.

:class:`StepBatch` is ``shmsteer_batch_resolve``: one call into the engine per step resolves the
whole batch (every span's slot, the sites anything steers, the table rows whose content changed).
:class:`DeviceTables` holds, per (hook, layer) site, a table ``[slots + 1, hidden]`` in the hidden
state's dtype on its device (row 0 zeros; row ``s`` the composed global + request vector of slot
``s``) and the clamp rows beside it, written only from a batch's updates: a steady batch writes
nothing, and a hooked site does one gather-add ``table[index]`` plus its clamps, with no call into
the engine. :mod:`shmsteer.torch_hook` builds its device path and its static (CUDA-graph) mode on
these two.

The composed rows are summed in float32 by the engine and converted once, when uploaded; the
clamp directions and bounds stay in float32 and the clamps are computed in float32 (as the
engine's CPU kernels do) whatever the hidden state's dtype.

The engine calls a step makes (the resolve, a gated step's report, the native path's resolve and
applies) go through the ``shmsteer._faststep`` extension when it is built (:data:`FAST_STEP`),
else through ctypes (``SHMSTEER_STEP_CTYPES=1`` forces that), with the same answers and errors.
"""

from __future__ import annotations

import ctypes
import threading
from ctypes import POINTER, Structure, byref, c_float, c_int32, c_int64, c_size_t, c_uint32, c_uint64, c_void_p
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ._torchreq import require_torch

require_torch(torch.__version__)

from . import _lib  # noqa: E402
from ._lib import check, faststep, lib  # noqa: E402
from ._spans import PackedSpans, SpanPacker  # noqa: E402  (re-exported: the packing is part of this API)
from .errors import ShapeError, ShmsteerError  # noqa: E402

#: Hidden-state dtypes both paths take.
DTYPES = (torch.float32, torch.bfloat16, torch.float16)

BATCH_END = 1
BATCH_RESET = 2
BATCH_NATIVE = 4


class UnsupportedDtypeError(ShmsteerError, TypeError):
    """A hooked hidden state whose dtype is not float32, bfloat16 or float16 (int8, float64, ...).
    Nothing was changed."""


class BatchOptionsC(Structure):
    _fields_ = [("max_slots", c_uint32), ("max_clamps", c_int32), ("max_gate_slots", c_uint32),
                ("max_row_gates", c_int32)]


# The result pointers are c_void_p (an address as an int, None for NULL): the views of them are
# cached by address (_Views), and reading a typed POINTER field makes an object per read.
class BatchGatesC(Structure):
    _fields_ = [("cols", c_uint32), ("slots", c_uint32), ("rows", c_void_p),
                ("updates", c_void_p), ("n_updates", c_size_t),
                ("probe", c_void_p), ("params", c_void_p),
                ("adds", c_void_p), ("n_adds", c_size_t), ("add_stage", c_void_p),
                ("sites", c_void_p), ("n_sites", c_size_t), ("report", c_uint32),
                ("factor", c_void_p)]


class BatchInfoC(Structure):
    _fields_ = [("version", c_uint64), ("checksum", c_uint64),
                ("index", c_void_p), ("rows", c_size_t), ("slots", c_uint32),
                ("sites", c_void_p), ("site_clamps", c_void_p), ("n_sites", c_size_t),
                ("updates", c_void_p), ("n_updates", c_size_t),
                ("stage", c_void_p), ("clamp_dirs", c_void_p), ("clamp_params", c_void_p),
                ("n_clamps", c_size_t), ("gates", BatchGatesC)]


#: Where BatchInfoC's fields past the version and checksum begin.
_INFO_TAIL = BatchInfoC.checksum.offset + ctypes.sizeof(c_uint64)
#: The extension behind :meth:`StepBatch.resolve` (None: ctypes; :data:`FAST_STEP_REASON` says why).
_faststep, FAST_STEP_REASON = faststep(ctypes.sizeof(BatchInfoC))
#: True when :meth:`StepBatch.resolve` calls the engine through ``shmsteer._faststep``.
FAST_STEP: bool = _faststep is not None
#: The extension's native site apply (``apply(stepper, hook, layer, rows, n, spans, n_spans,
#: bf16)``: the error code), None without it.
FAST_APPLY: Any = None if _faststep is None else _faststep.apply
#: The extension's native step end (``end(stepper)``: (error code, checksum)), None without it.
FAST_END: Any = None if _faststep is None else _faststep.end
#: The extension's ``index_rows(index, n, out, cap)`` (the steered rows of a resolve's index as
#: int64 rows and slots: their count), None without it.
INDEX_ROWS: Any = None if _faststep is None else _faststep.index_rows


class BatchCapturePlanC(Structure):
    _fields_ = [("sites", POINTER(c_int32)), ("n_sites", c_size_t), ("start", POINTER(c_int32)),
                ("rows", POINTER(c_int32)), ("n_rows", c_size_t)]


#: SHMSTEER_CAPTURE_* codes of the hidden-state dtypes.
CAPTURE_DTYPES = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3}


_h = c_void_p
for _name, (_res, _args) in {
    "shmsteer_batch_new": (ctypes.c_int, [_h, POINTER(BatchOptionsC), POINTER(_h)]),
    "shmsteer_batch_free": (ctypes.c_int, [_h]),
    "shmsteer_batch_reset": (ctypes.c_int, [_h]),
    "shmsteer_batch_sites": (ctypes.c_int, [_h, POINTER(c_int32), c_size_t]),
    "shmsteer_batch_resolve": (ctypes.c_int, [_h, c_uint64, POINTER(_lib.Span), c_size_t, c_int64, c_uint32,
                                              POINTER(BatchInfoC)]),
    "shmsteer_batch_report": (ctypes.c_int, [_h, POINTER(c_float), c_size_t, POINTER(c_uint64)]),
    "shmsteer_batch_capture_plan_get": (ctypes.c_int, [_h, POINTER(BatchCapturePlanC)]),
    "shmsteer_batch_capture": (ctypes.c_int, [_h, c_int32, c_int32, c_void_p, c_size_t]),
}.items():
    _fn = getattr(lib, _name)
    _fn.restype, _fn.argtypes = _res, _args


class _Memory:
    """Memory at an address as numpy's array interface (the view keeps this object as its base):
    no ctypes array type per length, which costs about 16 us for each new one."""

    __slots__ = ("__array_interface__",)

    def __init__(self, addr: int, shape: Tuple[int, ...], dtype: np.dtype) -> None:
        self.__array_interface__ = {"data": (addr, False), "shape": shape, "typestr": dtype.str, "version": 3}


def _np_view(ptr: Any, n: int, dtype: Any, shape: Tuple[int, ...]) -> np.ndarray:
    """A numpy view of n elements at ptr (an address or a ctypes pointer; an empty array when n
    is 0), of the given shape (n elements). Valid until the next resolve."""
    if n == 0:
        return np.zeros(shape, dtype=dtype)
    addr = ptr if isinstance(ptr, int) else ctypes.cast(ptr, c_void_p).value
    return np.asarray(_Memory(addr, shape, np.dtype(dtype)))


_EMPTY = np.zeros((0, 0), np.float32)


class _Views:
    """A batch's numpy views of the engine's result buffers, one per field, each remade only when
    its buffer moves or changes shape: the engine reuses its buffers from resolve to resolve, so
    a steady batch makes no view (making one costs about 7 us of Python, twelve of them most of
    a resolve before this cache)."""

    __slots__ = ("_at", "_seen", "_no_gates")

    def __init__(self) -> None:
        self._at: Dict[str, Tuple[Optional[int], Tuple[int, ...], np.ndarray]] = {}  # each field's last view
        # Views made before, by (field, address, shape): a batch whose size goes back and forth
        # (a request finishing, another joining) finds its buffers' views again.
        self._seen: Dict[Tuple[str, Optional[int], Tuple[int, ...]], np.ndarray] = {}
        self._no_gates: Dict[Tuple[int, int], "ResolvedGates"] = {}

    def no_gates(self, g: "BatchGatesC", rows: int, hidden: int) -> "ResolvedGates":
        """The gates of a resolve that has none (no column, update, add, site or report): one
        object per (rows, slots), kept (a batch whose size goes back and forth makes none)."""
        key = (rows, int(g.slots))
        e = self._no_gates.get(key)
        if e is None:
            if len(self._no_gates) >= 64:
                self._no_gates.clear()
            e = self._no_gates[key] = ResolvedGates(g, rows, hidden, _Views())
        return e

    def get(self, name: str, addr: Optional[int], dtype: Any, shape: Tuple[int, ...]) -> np.ndarray:
        e = self._at.get(name)
        if e is not None and e[0] == addr and e[1] == shape:
            return e[2]
        key = (name, addr, shape)
        v = self._seen.get(key)
        if v is None:
            n = 1
            for d in shape:
                n *= d
            v = _np_view(addr, n, dtype, shape) if addr else np.zeros(shape, dtype=dtype)
            if len(self._seen) >= 256:
                self._seen.clear()
            self._seen[key] = v
        self._at[name] = (addr, shape, v)
        return v


class ResolvedGates:
    """A resolve's declarative gates (``shmsteer_batch_gates``; numpy views valid until the next
    resolve). What the gates do to a request's rows as a whole is already in the slot tables;
    these are the per-row gate columns (see :class:`GateTables`).

    Attributes:
        cols: gate columns per row (0: no probe gate in the step).
        slots: rows a gate table needs (highest gate slot + 1).
        rows: int32 [rows, cols], the gate slot of each row's column (0: none).
        factor: float32 [rows, cols], what each row's gate is multiplied by (its request's
            attenuation).
        updates: int32 [n, 4]: slot, probe site, per_row, 0; probe: float32 [n, hidden] (the
            probe times its scale); params: float32 [n, 2] (threshold, sharpness).
        adds: int32 [m, 2]: site, slot; add_stage: float32 [m, hidden].
        sites: int32, the sites where the step's gate slots probe or add.
        report: whether the step awaits :meth:`StepBatch.report`.
    """

    __slots__ = ("cols", "slots", "rows", "factor", "updates", "probe", "params", "adds", "add_stage", "sites", "report")

    def __init__(self, g: BatchGatesC, rows: int, hidden: int, views: Optional[_Views] = None) -> None:
        v = views if views is not None else _Views()
        self.cols = cols = int(g.cols)
        self.slots = int(g.slots)
        self.report = bool(g.report)
        nu, na = g.n_updates, g.n_adds
        self.rows = v.get("g.rows", g.rows, np.int32, (rows, cols))
        self.factor = v.get("g.factor", g.factor, np.float32, (rows, cols))
        self.updates = v.get("g.updates", g.updates, np.int32, (nu, 4))
        self.probe = v.get("g.probe", g.probe, np.float32, (nu, hidden))
        self.params = v.get("g.params", g.params, np.float32, (nu, 2))
        self.adds = v.get("g.adds", g.adds, np.int32, (na, 2))
        self.add_stage = v.get("g.add_stage", g.add_stage, np.float32, (na, hidden))
        self.sites = v.get("g.sites", g.sites, np.int32, (g.n_sites,))


class Resolved:
    """What one :meth:`StepBatch.resolve` produced (numpy views of the engine's buffers, valid until
    the next resolve of the same batch).

    Attributes:
        version: the region version the step pinned.
        checksum: determinism checksum of what the batch resolved (spans, slots' content hashes).
        index: int32 [rows], the slot of every row (0: unsteered); index_addr: its address (0: none).
        slots: rows a table needs (highest slot of the step + 1).
        sites: int32, the steered sites (hook_id * layers + layer), ascending.
        site_clamps: int32, clamp directions at each of ``sites``.
        updates: int32 [n, 4]: site, slot, clamps, clamp_start of each row to write.
        stage: float32 [n, hidden]: the composed row of each update.
        clamp_dirs: float32 [m, hidden]; clamp_params: float32 [m, 3] (lo, hi, strength).
        gates: the step's gate columns (:class:`ResolvedGates`).
    """

    __slots__ = ("version", "checksum", "index", "index_addr", "slots", "sites", "site_clamps", "updates", "stage",
                 "clamp_dirs", "clamp_params", "gates")

    def __init__(self, info: BatchInfoC, hidden: int, views: Optional[_Views] = None) -> None:
        v = views if views is not None else _Views()
        self.version = info.version
        self.checksum = info.checksum
        self.index_addr = ia = info.index or 0
        self.index = v.get("index", ia, np.int32, (info.rows,))
        self.slots = int(info.slots)
        ns = info.n_sites
        self.sites = v.get("sites", info.sites, np.int32, (ns,))
        self.site_clamps = v.get("site_clamps", info.site_clamps, np.int32, (ns,))
        g = info.gates
        if g.cols or g.n_updates or g.n_adds or g.n_sites or g.report:
            self.gates = ResolvedGates(g, info.rows, hidden, v)
        else:  # no gate in the step (the usual case): one object per (rows, slots), kept
            self.gates = v.no_gates(g, info.rows, hidden)
        nu = info.n_updates
        self.updates = v.get("updates", info.updates, np.int32, (nu, 4))
        if nu == 0:  # a steady batch: nothing staged
            self.stage = self.clamp_dirs = self.clamp_params = _EMPTY
            return
        nc = info.n_clamps
        self.stage = v.get("stage", info.stage, np.float32, (nu, hidden))
        self.clamp_dirs = v.get("clamp_dirs", info.clamp_dirs, np.float32, (nc, hidden))
        self.clamp_params = v.get("clamp_params", info.clamp_params, np.float32, (nc, 3))


class StepBatch:
    """``shmsteer_batch_t`` over a :class:`~shmsteer.Stepper`: the one engine call of a step.

    Args:
        stepper: the stepper whose steps it resolves (same thread).
        hidden: the model's hidden size.
        max_slots: compositions a table holds besides row 0.
        max_clamps: clamp directions per (slot, site); 0: none (a clamp is BatchCapacityError).
    """

    def __init__(self, stepper: Any, hidden: int, max_slots: int = 256, max_clamps: int = 4,
                 max_gate_slots: int = 64, max_row_gates: int = 4) -> None:
        if not 1 <= max_slots <= 1 << 16 or not 0 <= max_clamps <= 64:
            raise ValueError(f"shmsteer: max_slots {max_slots} (1..65536) or max_clamps {max_clamps} (0..64)")
        if not 1 <= max_gate_slots <= 64 << 16 or not 0 <= max_row_gates <= 64:
            raise ValueError(f"shmsteer: max_gate_slots {max_gate_slots} (1..4194304) or max_row_gates {max_row_gates} (0..64)")
        out = c_void_p()
        opt = BatchOptionsC(max_slots, max_clamps if max_clamps > 0 else -1, max_gate_slots,
                            max_row_gates if max_row_gates > 0 else -1)
        check(lib.shmsteer_batch_new(stepper.handle, byref(opt), byref(out)))
        self._h: Optional[int] = out.value
        self._stepper = stepper
        self.hidden = hidden
        self.max_slots, self.max_clamps = max_slots, max_clamps
        self.max_gate_slots, self.max_row_gates = max_gate_slots, max_row_gates
        self._info = BatchInfoC()
        self._views = _Views()  # the result buffers' views, reused while the engine reuses the buffers
        self._last: Optional[Resolved] = None  # the last resolve's result and its info's bytes
        self._last_info = b""
        # The resolve without ctypes (shmsteer._faststep), which compares the answers itself.
        # Chosen here, once: set to None (the ctypes path) before the first resolve, if at all.
        self._fast: Any = None if _faststep is None else _faststep.Resolver(self._h, ctypes.addressof(self._info))
        self._gsum = c_uint64()
        self._scores = np.empty(0, np.float32)  # report()'s float32 copy of the scores
        self._scores_ptr: Any = None
        self.resolves = 0  #: engine calls made by resolve()
        self.reports = 0  #: engine calls made by report()
        self.gate_checksum = 0  #: the last reported step's gate decisions (Stepper.GateChecksum)

    def close(self) -> None:
        if self._h is not None:
            lib.shmsteer_batch_free(self._h)
            self._h = None

    def __del__(self) -> None:  # the stepper frees its own handle; free ours first when we can
        try:
            self.close()
        except Exception:
            pass

    def reset(self) -> None:
        """Forget what the tables hold: the next resolve reports every steered row."""
        check(lib.shmsteer_batch_reset(self._h))

    def set_sites(self, sites: Sequence[int]) -> None:
        """Restrict the batch to these sites (hook_id * layers + layer; empty: all)."""
        arr = (c_int32 * len(sites))(*sites)
        check(lib.shmsteer_batch_sites(self._h, arr, len(sites)))

    def resolve(self, spans: PackedSpans, rows: int, version: int = 0, end: bool = False,
                reset: bool = False) -> Resolved:
        """Begin a step of the stepper at ``version`` and resolve ``spans`` (SpanPacker.pack) over
        ``rows`` rows. The step stays open for CPU applies (end it with the stepper's end())
        unless ``end``; ``reset`` first forgets what the tables hold (in the same call)."""
        if self._h is None:
            from .errors import ClosedError
            raise ClosedError("shmsteer: batch closed")
        self.resolves += 1
        flags = (BATCH_END if end else 0) | (BATCH_RESET if reset else 0)
        st = self._stepper
        st._enter("batch resolve")  # the stepper's one-thread guard
        try:
            fast = self._fast
            if fast is not None:
                same = fast.resolve(version, spans.addr, spans.n, rows, flags)
                if same > 0:
                    check(same)
            else:
                check(lib.shmsteer_batch_resolve(self._h, version, spans.ptr, spans.n, rows, flags, byref(self._info)))
                same = None
            st._step_thread = None if end else threading.get_ident()
        finally:
            st._busy.release()
        return self._result(same)

    def _result(self, same: Optional[int]) -> Resolved:
        """The resolve's :class:`Resolved`: the last one, its version and checksum updated, when
        every other byte of the engine's answer (each buffer's address and length, the counts,
        the gate fields) is the last resolve's, for then it would be made of the same views (the
        views show the buffers' current content either way). ``same``: the extension's
        comparison (its SAME, -1: equal; CHANGED, 0), None to compare here."""
        info = self._info
        last = self._last
        if same is None:
            raw = bytes(info)
            if last is not None and raw[_INFO_TAIL:] == self._last_info[_INFO_TAIL:]:
                last.version, last.checksum = info.version, info.checksum
                return last
            self._last_info = raw
        elif same < 0 and last is not None:
            last.version, last.checksum = info.version, info.checksum
            return last
        else:
            self._last_info = b""  # no ctypes comparison may match a Resolved it did not make
        self._last = res = Resolved(info, self.hidden, self._views)
        return res

    def resolve_native(self, spans: PackedSpans, rows: int, version: int = 0) -> int:
        """Begin a step of the stepper at ``version`` and resolve ``spans`` over ``rows`` rows for
        the stepper's own applies (``SHMSTEER_BATCH_NATIVE``): the step stays open; returns the
        batch checksum (what :meth:`resolve` of the same batch gives) and builds none of the
        device path's tables, views or plans."""
        if self._h is None:
            from .errors import ClosedError
            raise ClosedError("shmsteer: batch closed")
        self.resolves += 1
        st = self._stepper
        st._enter("batch resolve")  # the stepper's one-thread guard
        try:
            fast = self._fast
            if fast is not None:
                check(fast.begin(version, spans.addr, spans.n, rows))
            else:
                check(lib.shmsteer_batch_resolve(self._h, version, spans.ptr, spans.n, rows, BATCH_NATIVE, byref(self._info)))
            st._step_thread = threading.get_ident()
        finally:
            st._busy.release()
        return int(self._info.checksum)

    def capture_plan(self) -> Optional["CapturePlan"]:
        """The last resolve's capture plan (None: nothing to capture): numpy copies of the sites
        whose rows to copy for capture consumers and, per site, the block rows to gather (the
        stepper captures: :meth:`~shmsteer.Stepper.capture_start`)."""
        if self._h is None:
            from .errors import ClosedError
            raise ClosedError("shmsteer: batch closed")
        out = BatchCapturePlanC()
        check(lib.shmsteer_batch_capture_plan_get(self._h, byref(out)))
        if out.n_sites == 0:
            return None
        sites = _np_view(out.sites, out.n_sites, np.int32, (out.n_sites,)).copy()
        start = _np_view(out.start, out.n_sites + 1, np.int32, (out.n_sites + 1,)).copy()
        rows = _np_view(out.rows, out.n_rows, np.int32, (out.n_rows,)).copy()
        return CapturePlan(sites, start, rows)

    def capture(self, site: int, dtype: torch.dtype, ptr: int, n_bytes: int) -> None:
        """Hand back ``site``'s gathered rows: ``n_bytes`` at ``ptr``, the plan's rows of the
        site in order, elements of ``dtype``, copied before the site's steering add. Valid until
        the next resolve."""
        if self._h is None:
            from .errors import ClosedError
            raise ClosedError("shmsteer: batch closed")
        code = CAPTURE_DTYPES.get(dtype)
        if code is None:
            raise UnsupportedDtypeError(f"shmsteer: capture of {dtype}; float32, bfloat16 or float16")
        check(lib.shmsteer_batch_capture(self._h, site, code, ptr, n_bytes))

    def report_tensor(self, scores: Optional[torch.Tensor]) -> int:
        """:meth:`report` of a float32 ``[rows, cols]`` tensor on any device (None: no columns):
        through the extension, a CPU float32 contiguous tensor's memory as it is (a device one
        copied to the host first), no numpy copy."""
        fast = self._fast
        if fast is None or (scores is not None and scores.dtype is not torch.float32):
            return self.report(None if scores is None else scores.cpu().numpy())
        if self._h is None:
            from .errors import ClosedError
            raise ClosedError("shmsteer: batch closed")
        addr = n = 0
        s = scores
        if s is not None and s.numel():
            if not s.is_cpu:
                s = s.cpu()
            if not s.is_contiguous():
                s = s.contiguous()
            addr, n = s.data_ptr(), s.numel()
        self.reports += 1
        st = self._stepper
        st._enter("batch report")
        try:
            rc, gsum = fast.report(addr, n)  # s keeps the scores alive through the call
        finally:
            st._busy.release()
        check(rc)
        self.gate_checksum = gsum
        return gsum

    def report(self, scores: Optional[np.ndarray]) -> int:
        """Hand a resolved step's probe scores back (its ``gates.report`` was true): ``scores`` is
        float32 [rows, cols] (None when cols is 0). The host-evaluated scopes decide and advance;
        returns the step's gate decision checksum, the same a native step of the same decisions
        gives."""
        if self._h is None:
            from .errors import ClosedError
            raise ClosedError("shmsteer: batch closed")
        ptr, n = None, 0
        if scores is not None and scores.size:
            n = scores.size
            buf = self._scores
            if buf.size < n:  # one buffer, its pointer made once (data_as costs ~10 us a call)
                buf = self._scores = np.empty(n, np.float32)
                self._scores_ptr = buf.ctypes.data_as(POINTER(c_float))
            np.copyto(buf[:n].reshape(scores.shape), scores, casting="unsafe")
            ptr = self._scores_ptr
        self.reports += 1
        st = self._stepper
        st._enter("batch report")
        try:
            check(lib.shmsteer_batch_report(self._h, ptr, n, byref(self._gsum)))
        finally:
            st._busy.release()
        self.gate_checksum = self._gsum.value
        return self.gate_checksum


class CapturePlan:
    """A resolve's capture plan: ``sites`` (int32, ascending) and, for ``sites[i]``, the block
    rows ``rows[start[i]:start[i+1]]`` (int32) to gather before that site's steering add."""

    __slots__ = ("sites", "start", "rows", "index")

    def __init__(self, sites: np.ndarray, start: np.ndarray, rows: np.ndarray) -> None:
        self.sites, self.start, self.rows = sites, start, rows
        self.index = {int(s): i for i, s in enumerate(sites.tolist())}

    def site_rows(self, site: int) -> Optional[Tuple[int, int]]:
        """(offset, count) of site's rows in ``rows``, or None when it captures none."""
        i = self.index.get(site)
        if i is None:
            return None
        return int(self.start[i]), int(self.start[i + 1] - self.start[i])

    def key(self) -> bytes:
        return self.sites.tobytes() + self.start.tobytes() + self.rows.tobytes()


def check_hidden(t: torch.Tensor, hidden: int) -> None:
    """Refuse, before anything is changed, a hooked output the paths cannot steer."""
    if t.dtype not in DTYPES:
        raise UnsupportedDtypeError(f"shmsteer: hooked output has dtype {t.dtype}; steer float32, bfloat16 or float16")
    if t.dim() == 0 or t.shape[-1] != hidden:
        raise ShapeError(f"shmsteer: hooked output has shape {tuple(t.shape)}, its last dimension must be the hidden size {hidden}")
    if not t.is_contiguous():
        raise ShapeError("shmsteer: hooked output is not contiguous; steer a contiguous tensor (.contiguous() before the hook point)")


class _Site:
    """One site's tables: vectors [cap, hidden] (dtype), clamp dirs [cap, K, hidden] and params
    [cap, K, 3] (float32; None until a clamp arrives, or preallocated in static mode)."""

    __slots__ = ("vec", "dirs", "params")

    def __init__(self, vec: torch.Tensor) -> None:
        self.vec = vec
        self.dirs: Optional[torch.Tensor] = None
        self.params: Optional[torch.Tensor] = None


class DeviceTables:
    """Per-site steering tables on one device in one dtype, kept current from resolves.

    Args:
        hidden: the hidden size.
        device, dtype: where the tables live and the hidden state's dtype.
        max_clamps: K, clamp rows per (slot, site).
        capacity: table rows to start with (grown as slots are used); ``static`` tables are
            allocated at ``capacity`` for every site in ``sites`` up front and never grow.
        site_capacity: the sites the store of tables that grow holds before it grows (the
            sites a hooks object attached).

    The vectors of tables that grow are views of one ``[sites, capacity, hidden]`` store (site
    ``s`` at ``pos[s]``), so one gather takes a batch's rows of every site
    (:meth:`gather`); a growth moves every site's view (``moves`` counts them). Static tables
    are one tensor a site: a graph keeps their addresses.
    """

    def __init__(self, hidden: int, device: Any, dtype: torch.dtype, max_clamps: int, capacity: int = 16,
                 static: bool = False, sites: Sequence[int] = (), site_capacity: int = 4) -> None:
        self.hidden, self.device, self.dtype, self.k = hidden, torch.device(device), dtype, max_clamps
        self._site_cap = max(1, site_capacity)
        self.capacity, self.static = capacity, static
        self.sites: Dict[int, _Site] = {}
        self.order: List[int] = []  #: the sites in the store's order (tables that grow)
        self.pos: Dict[int, int] = {}  #: each site's place in order
        self._store: Optional[torch.Tensor] = None  # [site capacity, capacity, hidden]
        self._used: Optional[torch.Tensor] = None  # its first len(order) sites
        self.moves = 0  #: times the vectors' views moved (a new store)
        self.uploads = 0  #: table rows written
        for s in sites:
            st = self._site(s)
            if static and max_clamps > 0:
                self._clamp_rows(st)

    def _site(self, s: int) -> _Site:
        st = self.sites.get(s)
        if st is None:
            if self.static:
                st = self.sites[s] = _Site(torch.zeros(self.capacity, self.hidden, dtype=self.dtype, device=self.device))
                return st
            store = self._store
            if store is None or store.shape[0] == len(self.order):
                self._restore(max(self._site_cap, 2 * len(self.order)), self.capacity)
                store = self._store
                assert store is not None
            self.pos[s] = len(self.order)
            self.order.append(s)
            st = self.sites[s] = _Site(store[len(self.order) - 1])
            self._used = None
        return st

    def _restore(self, nsites: int, cap: int) -> None:
        """A new store of nsites x cap rows holding the old one's rows; every site's view moves."""
        store = torch.zeros(nsites, cap, self.hidden, dtype=self.dtype, device=self.device)
        old = self._store
        if old is not None:
            store[: old.shape[0], : old.shape[1]] = old
        self._store, self._used = store, None
        for i, s in enumerate(self.order):
            self.sites[s].vec = store[i]
        self.moves += 1

    def gather(self, index: torch.Tensor) -> torch.Tensor:
        """Rows ``index`` of every site's vectors in one gather: ``[len(order), len(index),
        hidden]``, site ``order[i]``'s at ``[i]`` (tables that grow only)."""
        used = self._used
        if used is None:
            assert self._store is not None, "gather of static tables or of tables without a site"
            used = self._used = self._store[: len(self.order)]
        return used.index_select(1, index)

    def _clamp_rows(self, st: _Site) -> None:
        n = st.vec.shape[0]
        st.dirs = torch.zeros(n, self.k, self.hidden, dtype=torch.float32, device=self.device)
        st.params = torch.zeros(n, self.k, 3, dtype=torch.float32, device=self.device)

    def _grow(self, need: int) -> None:
        if need <= self.capacity:
            return
        if self.static:
            raise ShapeError(f"shmsteer: static tables hold {self.capacity - 1} slots, the batch uses {need - 1}")
        cap = self.capacity
        while cap < need:
            cap *= 2
        self.capacity = cap  # before the store: a site made from here on has cap rows
        if self._store is not None:
            self._restore(self._store.shape[0], cap)
        for st in self.sites.values():
            if st.dirs is not None and st.params is not None:
                n = st.dirs.shape[0]
                dirs = torch.zeros(cap, self.k, self.hidden, dtype=torch.float32, device=self.device)
                params = torch.zeros(cap, self.k, 3, dtype=torch.float32, device=self.device)
                dirs[:n], params[:n] = st.dirs, st.params
                st.dirs, st.params = dirs, params

    def update(self, r: Resolved) -> None:
        """Write the rows a resolve reported: one host-to-device copy of the staged rows, then one
        index_copy_ per site that changed (converting to the table's dtype)."""
        self._grow(r.slots)
        u = r.updates
        if len(u) == 0:
            return
        stage = torch.from_numpy(r.stage).to(self.device, non_blocking=False)
        if self.device.type == "cpu":
            stage = stage.clone()  # the engine's buffer is reused by the next resolve
        slots_all = torch.from_numpy(u[:, 1].astype(np.int64)).to(self.device)
        sites = u[:, 0]
        # Updates come grouped by slot; group them by site with one stable sort.
        order = np.argsort(sites, kind="stable")
        bounds = np.flatnonzero(np.diff(sites[order])) + 1
        starts = np.concatenate(([0], bounds))
        ends = np.concatenate((bounds, [len(order)]))
        order_t = torch.from_numpy(order.astype(np.int64)).to(self.device)
        cl = u[:, 2]
        has_clamps = bool(cl.any())
        if has_clamps:
            dirs_all = torch.from_numpy(r.clamp_dirs).to(self.device)
            params_all = torch.from_numpy(r.clamp_params).to(self.device)
        for a, b in zip(starts.tolist(), ends.tolist()):
            sel = order_t[a:b]
            site = int(sites[order[a]])
            st = self._site(site)
            rows = slots_all.index_select(0, sel)
            st.vec.index_copy_(0, rows, stage.index_select(0, sel).to(self.dtype))
            idx = order[a:b]
            if st.dirs is None and cl[idx].any():
                if self.k == 0:
                    raise ShapeError("shmsteer: a clamp reached tables built without clamp rows (max_clamps=0)")
                self._clamp_rows(st)
            if st.dirs is not None and st.params is not None:
                st.dirs.index_fill_(0, rows, 0.0)
                st.params.index_fill_(0, rows, 0.0)
                for i in idx[cl[idx] > 0].tolist():
                    slot, n, c0 = int(u[i, 1]), int(u[i, 2]), int(u[i, 3])
                    st.dirs[slot, :n] = dirs_all[c0:c0 + n]
                    st.params[slot, :n] = params_all[c0:c0 + n]
        self.uploads += len(u)


class GateTables:
    """The declarative gates' tables on one device (steer/batch_gates.go), written only from
    resolves' gate updates, so a steady batch writes nothing: per gate slot its probe row
    (float32 ``[cap, hidden]``, the probe times its scale), threshold, sharpness, probe site and
    whether it gates rows; per site its add rows (``[cap, hidden]`` in the hidden dtype). Row 0 is
    zeros (a column naming slot 0 does nothing). ``static`` tables are allocated at ``capacity``
    up front (adds for ``sites``) and never grow."""

    def __init__(self, hidden: int, device: Any, dtype: torch.dtype, capacity: int = 8, static: bool = False,
                 sites: Sequence[int] = ()) -> None:
        self.hidden, self.device, self.dtype = hidden, torch.device(device), dtype
        self.capacity, self.static = capacity, static
        f32 = torch.float32
        self.probe = torch.zeros(capacity, hidden, dtype=f32, device=self.device)
        self.thr = torch.zeros(capacity, dtype=f32, device=self.device)
        self.sharp = torch.zeros(capacity, dtype=f32, device=self.device)
        self.per_row = torch.zeros(capacity, dtype=f32, device=self.device)
        self.site = torch.full((capacity,), -1, dtype=torch.int64, device=self.device)
        self.site_host = np.full(capacity, -1, np.int64)  #: the probe site of each slot, on the host
        self.probe_bytes: Dict[int, bytes] = {}  #: each written slot's probe row, its bytes (equal bytes, equal scores)
        self.adds: Dict[int, torch.Tensor] = {}
        self.adds_host: Dict[int, np.ndarray] = {}  #: per site, which slots' add rows are non-zero
        self.uploads = 0  #: gate slots and add rows written
        for st in sites:
            self.add_table(st)

    def add_table(self, site: int) -> torch.Tensor:
        t = self.adds.get(site)
        if t is None:
            t = self.adds[site] = torch.zeros(self.capacity, self.hidden, dtype=self.dtype, device=self.device)
        return t

    def _grow(self, need: int) -> None:
        if need <= self.capacity:
            return
        if self.static:
            raise ShapeError(f"shmsteer: static gate tables hold {self.capacity - 1} gate slots, the batch uses {need - 1}")
        cap = self.capacity
        while cap < need:
            cap *= 2

        def grown(t: torch.Tensor, fill: float = 0) -> torch.Tensor:
            out = torch.full((cap,) + tuple(t.shape[1:]), fill, dtype=t.dtype, device=self.device)
            out[: t.shape[0]] = t
            return out

        self.adds_host = {k: np.concatenate((v, np.zeros(cap - len(v), bool))) for k, v in self.adds_host.items()}

        self.probe, self.thr, self.sharp, self.per_row = (grown(self.probe), grown(self.thr), grown(self.sharp),
                                                          grown(self.per_row))
        self.site = grown(self.site, -1)
        self.site_host = np.concatenate((self.site_host, np.full(cap - self.capacity, -1, np.int64)))
        self.adds = {k: grown(v) for k, v in self.adds.items()}
        self.capacity = cap

    def update(self, g: ResolvedGates) -> None:
        """Write a resolve's gate slots and add rows (one host-to-device copy of each kind)."""
        self._grow(g.slots)
        dev = self.device
        u = g.updates
        if len(u):
            slots = torch.from_numpy(u[:, 0].astype(np.int64)).to(dev)
            self.probe.index_copy_(0, slots, torch.from_numpy(np.array(g.probe)).to(dev))
            params = torch.from_numpy(np.array(g.params)).to(dev)
            self.thr.index_copy_(0, slots, params[:, 0].contiguous())
            self.sharp.index_copy_(0, slots, params[:, 1].contiguous())
            self.per_row.index_copy_(0, slots, torch.from_numpy(u[:, 2].astype(np.float32)).to(dev))
            self.site.index_copy_(0, slots, torch.from_numpy(u[:, 1].astype(np.int64)).to(dev))
            self.site_host[u[:, 0]] = u[:, 1]
            for slot, row in zip(u[:, 0].tolist(), g.probe):
                self.probe_bytes[slot] = row.tobytes()
            self.uploads += len(u)
        a = g.adds
        if len(a):
            stage = torch.from_numpy(np.array(g.add_stage)).to(dev)
            nonzero = np.asarray(g.add_stage).any(axis=1)
            for site in np.unique(a[:, 0]).tolist():
                sel = np.flatnonzero(a[:, 0] == site)
                nz = self.adds_host.setdefault(site, np.zeros(self.capacity, bool))
                nz[a[sel, 1]] = nonzero[sel]
                rows = torch.from_numpy(a[sel, 1].astype(np.int64)).to(dev)
                self.add_table(site).index_copy_(0, rows, stage[torch.from_numpy(sel).to(dev)].to(self.dtype))
            self.uploads += len(a)


def apply_clamps(h: torch.Tensor, dirs: torch.Tensor, params: torch.Tensor, k: int,
                 tmp: Optional[torch.Tensor] = None, pc: Optional[torch.Tensor] = None) -> None:
    """Clamp rows h (float32, [n, hidden]) in place with the first k clamp records of each row
    (dirs [n, K, hidden], params [n, K, 3], gathered by slot), in order: p = h·u,
    h += strength * (clip(p, lo, hi) - p) * u, as the engine's kernels.Clamp. A record of zeros is
    a no-op. With tmp ([n, hidden]) and pc ([2, n]) float32 buffers it allocates nothing."""
    for j in range(k):
        u = dirs[:, j]
        p = torch.sum(torch.mul(h, u, out=tmp), dim=1, out=None if pc is None else pc[0])
        c = torch.maximum(p, params[:, j, 0], out=None if pc is None else pc[1])
        torch.minimum(c, params[:, j, 1], out=c)
        c.sub_(p).mul_(params[:, j, 2])
        h.addcmul_(c.unsqueeze(1), u)


__all__ = ["StepBatch", "SpanPacker", "PackedSpans", "Resolved", "ResolvedGates", "DeviceTables", "GateTables", "UnsupportedDtypeError", "DTYPES", "check_hidden",
           "apply_clamps"]
