"""Spans in the C ABI's ``shmsteer_span`` layout: :class:`PackedSpans` (a numpy record array the
engine's calls read in place) and :class:`SpanPacker`, which packs a step's spans once per
distinct layout. :mod:`shmsteer.device` re-exports both; the hooks and :mod:`shmsteer.hf` pack
through them. Numpy and ctypes only (no torch); the records of a list of 5-tuples are written and
compared with the last step's in C when ``shmsteer._faststep`` is built (its ``pack``), and in
Python otherwise (``$SHMSTEER_STEP_CTYPES`` set, or not built)."""

from __future__ import annotations

import ctypes
import operator
from ctypes import POINTER, c_void_p
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _lib
from .client import I32, PHASES, _int, span_fields

_PHASE_NAMES = {"prefill": PHASES["prefill"], "decode": PHASES["decode"]}
_SPAN = np.dtype([("id", np.uint64), ("id_len", np.uint64), ("start", np.int64), ("end", np.int64),
                  ("phase", np.int32), ("first_position", np.int32)])
assert _SPAN.itemsize == ctypes.sizeof(_lib.Span), "shmsteer_span layout"

_ext, _ = _lib.extension("_faststep", _lib.STEP_CTYPES_ENV)
#: The extension's span packing (None: Python's); checked against the header's record size.
_PACK: Any = _ext.pack if _ext is not None and _ext.SPAN_BYTES == _SPAN.itemsize else None


class PackedSpans:
    """Spans in ``shmsteer_span`` layout, which the C calls read in place at ``addr``: a numpy
    record array (``arr``), or the extension's bytearray of records, whose numpy view is made
    when ``arr`` or ``positions`` is first read."""

    __slots__ = ("_arr", "_buf", "_ptr", "addr", "n", "rows")

    def __init__(self, arr: np.ndarray, rows: Optional[int] = None) -> None:
        self._arr: Optional[np.ndarray] = arr
        self._buf: Any = None
        self.n = len(arr)
        self._ptr: Any = None
        self.addr: int = arr.ctypes.data if self.n else 0  # the records' address (the _faststep extension's)
        self.rows = rows if rows is not None else (int(arr["end"].max()) if self.n else 0)  #: the highest end

    @classmethod
    def _adopt(cls, buf: bytearray, addr: int, rows: int) -> "PackedSpans":
        """Records the extension packed: buf (a bytearray of records), the address of its bytes."""
        p = cls.__new__(cls)
        p._arr, p._buf, p._ptr = None, buf, None
        p.n = len(buf) // _SPAN.itemsize
        p.addr = addr if p.n else 0
        p.rows = rows
        return p

    @property
    def arr(self) -> np.ndarray:
        """The records as a numpy record array (writing to it writes the records)."""
        a = self._arr
        if a is None:
            a = self._arr = np.frombuffer(self._buf, dtype=_SPAN)  # pins the bytearray's size
        return a

    @property
    def positions(self) -> np.ndarray:
        """The records' first positions (a view: a decode step writes its positions here)."""
        return self.arr["first_position"]

    @property
    def ptr(self) -> Any:
        """The records as a ctypes pointer (None when there are none), made at the first use:
        the ctypes calls take it, the extension the address."""
        p = self._ptr
        if p is None and self.n:
            p = self._ptr = ctypes.cast(self.addr, POINTER(_lib.Span))
        return p

    def __len__(self) -> int:
        return self.n


class SpanPacker:
    """Packs (request id, start, end, phase[, first_position]) spans once per distinct layout: a
    step whose spans equal the previous step's reuses its packing, and so does a step whose spans
    differ from the previous step's only in their first positions (a decode batch advancing by a
    token: the positions are written into the packing in place, nothing else is packed again).
    Spans already packed (a :class:`PackedSpans`, whose id addresses its maker keeps alive) pass
    through as they are, and leave this packer's own reuse as it was."""

    def __init__(self) -> None:
        self._ids: Dict[str, Tuple[bytes, int]] = {}
        self._last: Optional[List[Any]] = None  # the spans packed last, as tuples
        self._packed: Optional[PackedSpans] = None
        self.packs = 0  #: layouts packed from scratch (not reused, not advanced)
        self._pack = _PACK  # the extension's (None: Python only); set per packer by tests
        self._scratch = np.empty(16, dtype=_SPAN)  # where the extension writes a step's records
        self._scratch_addr: int = self._scratch.ctypes.data

    def _id(self, rid: str) -> Tuple[bytes, int]:
        ent = self._ids.get(rid)
        if ent is None:
            if len(self._ids) > 1 << 14:
                self._ids.clear()
            b = rid.encode() if isinstance(rid, str) else bytes(rid)
            addr = ctypes.cast(ctypes.c_char_p(b), c_void_p).value or 0
            ent = self._ids[rid] = (b, addr)  # the bytes object keeps addr valid
        return ent

    def pack(self, spans: Sequence[Any]) -> PackedSpans:
        if type(spans) is PackedSpans:  # packed by the caller (hf's decode steps): as it is
            return spans
        packed, last = self._packed, self._last
        fast = self._pack
        if fast is not None and (type(spans) is list or type(spans) is tuple):  # others: Python's
            n = len(spans)
            if n > len(self._scratch):
                self._scratch = np.empty(max(n, 2 * len(self._scratch), 16), dtype=_SPAN)
                self._scratch_addr = self._scratch.ctypes.data
            r = fast(spans, self._ids, self._scratch_addr, len(self._scratch),
                     packed.addr if packed is not None else 0, packed.n if packed is not None else -1)
            if type(r) is tuple:  # new records
                self._last = None  # compared in C from now on (see below)
                self._packed = PackedSpans._adopt(*r)
                self.packs += 1
                return self._packed
            if r >= 0:  # the same records, or their positions advanced in place
                # A later pack in Python must not compare with spans packed before an advance
                # written here.
                self._last = None
                return packed  # type: ignore[return-value]
        if packed is not None and last is not None:
            if last == spans:
                return packed
            pos = _advanced(spans, last)
            if pos is not None:
                packed.positions[:] = pos
                self._last = list(spans)
                return packed
        recs = self._records(spans)
        if recs is None:
            recs = []
            for i, sp in enumerate(spans):
                rid, start, end, phase, p = span_fields(i, sp)
                b, addr = self._id(rid)
                recs.append((addr, len(b), operator.index(start), operator.index(end), PHASES[phase],
                             _int(f"span {i} first_position", p, I32)))
        self._packed = PackedSpans(np.array(recs, dtype=_SPAN), max([r[3] for r in recs]) if recs else 0)
        self._last = [tuple(sp) for sp in spans]  # tuples: a caller's list mutated later cannot equal them
        self.packs += 1
        return self._packed

    def _records(self, spans: Sequence[Any]) -> Optional[List[Tuple[int, int, int, int, int, int]]]:
        """The records of spans that are all 5-tuples of Python ints and a phase name, with ids
        packed before (a batch that changed: one request joined or left); None for anything
        else, which the general loop above converts and checks."""
        recs = []
        ids, hi = self._ids, I32[1]
        for sp in spans:
            if type(sp) is not tuple or len(sp) != 5:
                return None
            rid, start, end, phase, p = sp
            ent = ids.get(rid)
            ph = _PHASE_NAMES.get(phase) if type(phase) is str else None
            if (ent is None or ph is None or type(start) is not int or type(end) is not int or type(p) is not int
                    or not 0 <= p <= hi):
                return None
            recs.append((ent[1], len(ent[0]), start, end, ph, p))
        return recs


def _advanced(spans: Sequence[Any], last: List[Any]) -> Optional[List[int]]:
    """The first positions of spans when they are 5-tuples equal to last's but for those (ints in
    0..2^31-1); else None."""
    if len(spans) != len(last):
        return None
    pos = []
    for a, b in zip(spans, last):
        if (type(a) is not tuple or len(a) != 5 or len(b) != 5 or a[0] != b[0] or a[1] != b[1] or a[2] != b[2]
                or a[3] != b[3]):
            return None
        p = a[4]
        if type(p) is not int or not 0 <= p <= I32[1]:
            return None
        pos.append(p)
    return pos


__all__ = ["PackedSpans", "SpanPacker"]
