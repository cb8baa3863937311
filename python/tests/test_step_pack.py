"""The span packing and the device path's row index in C (``shmsteer._faststep``'s ``pack``
and ``index_rows``) against their Python forms: the same records, the same reuse of a packing,
the same errors, the same rows and slots; and every span the C form does not take goes to the
Python form."""

from __future__ import annotations

import ctypes
import os
import random
import sysconfig
from typing import Any, List, Tuple

import numpy as np
import pytest

from shmsteer import _lib
from shmsteer import _spans as S
from shmsteer._spans import SpanPacker

FALLBACK = -1


def _need_pack() -> Any:
    if S._PACK is not None:
        return S._PACK
    why = "$SHMSTEER_STEP_CTYPES is set" if os.environ.get(_lib.STEP_CTYPES_ENV, "") not in ("", "0") else None
    if why is None and os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        pytest.fail("Python.h is installed but shmsteer._faststep's packing is not in use: go generate ./capi")
    pytest.skip(f"shmsteer._faststep's packing is not in use: {why or 'not built (no Python.h)'}")


def _records(p: S.PackedSpans) -> List[Tuple[Any, ...]]:
    """The records with each id read back through its address (the addresses differ per packer)."""
    return [(ctypes.string_at(int(r["id"]), int(r["id_len"])), int(r["start"]), int(r["end"]), int(r["phase"]),
             int(r["first_position"])) for r in p.arr]


def _outcome(p: SpanPacker, spans: Any) -> Tuple[Any, ...]:
    try:
        got = p.pack(spans)
    except Exception as e:  # noqa: BLE001 (the exact exception is compared)
        return ("raised", type(e).__name__, str(e))
    return ("packed", _records(got), got.rows, got.n)


def _random_spans(rng: random.Random, ids: List[str]) -> Any:
    """A step's spans: mostly well-formed 5-tuples, now and then an odd or bad one."""
    n = rng.randint(0, 6)
    rows, spans = 0, []
    for rid in rng.sample(ids, min(n, len(ids))):
        k = rng.choice((1, 1, 1, 3))
        spans.append((rid, rows, rows + k, "decode" if k == 1 else "prefill", rng.randint(0, 40)))
        rows += k
    if spans and rng.random() < 0.3:
        i = rng.randrange(len(spans))
        sp = list(spans[i])
        j = rng.randrange(5)
        sp[j] = rng.choice({0: ["new-" + str(rng.randint(0, 3)), b"a", 7, "é-" + str(rng.randint(0, 1))],
                            1: [np.int64(0), True, -1, 1 << 31, 2.0],
                            2: [np.int32(5), 1 << 40, -3, None],
                            3: ["decoding", 2, "Decode", None],
                            4: [-1, 1 << 31, np.int64(4), 3.0, False]}[j])
        spans[i] = tuple(sp) if rng.random() < 0.8 else sp
    return spans if rng.random() < 0.9 else tuple(spans)


def test_pack_matches_python():
    """Random steps (advancing, repeated, reordered, growing and shrinking batches, with odd and
    bad spans among them) through a packer in C and one in Python: the same records and rows,
    the same errors; and a step of well-formed spans after well-formed ones reuses the packing
    (same object, same count of packings) exactly when the Python packer does."""
    _need_pack()
    rng = random.Random(43)
    ids = [f"req-{i}" for i in range(8)] + ["ü-" + "x" * 40]
    fast, slow = SpanPacker(), SpanPacker()
    slow._pack = None
    prev: Any = None
    clean_run = False
    for step in range(3000):
        r = rng.random()
        if prev is not None and r < 0.35 and all(type(s) is tuple and len(s) == 5 and type(s[4]) is int for s in prev):
            spans: Any = [s[:4] + (s[4] + 1,) for s in prev]  # advanced by a token
        elif prev is not None and r < 0.45:
            spans = list(prev)
        else:
            spans = _random_spans(rng, ids)
        before = (fast._packed, fast.packs, slow._packed, slow.packs)
        got, want = _outcome(fast, spans), _outcome(slow, spans)
        assert got == want, f"step {step}: {spans!r}"
        clean = got[0] == "packed" and all(type(s) is tuple and len(s) == 5 and type(s[0]) is str
                                           and all(type(v) is int for v in (s[1], s[2], s[4])) for s in spans)
        if clean and clean_run:
            assert (fast._packed is before[0]) == (slow._packed is before[2]), f"step {step}: reuse differs"
            assert fast.packs - before[1] == slow.packs - before[3], f"step {step}"
        clean_run = clean
        prev = spans


def test_pack_falls_back_for_what_it_does_not_take():
    """The C packing answers FALLBACK, writing nothing the packer uses, for any span but a
    5-tuple of (str, int, int, "prefill"/"decode", int) in range, for more spans than the
    scratch holds, and when the ids dict is full; the packer then packs in Python."""
    pack = _need_pack()
    scratch = np.zeros(4, dtype=S._SPAN)
    addr = scratch.ctypes.data
    ok = ("a", 0, 1, "decode", 3)

    class Str(str):
        pass

    odd = [[list(ok)], [ok[:4]], [ok + (0,)], [(b"a",) + ok[1:]], [(Str("a"),) + ok[1:]],
           [("a", np.int64(0), 1, "decode", 3)], [("a", True, 1, "decode", 3)], [("a", -1, 1, "decode", 3)],
           [("a", 0, 1 << 31, "decode", 3)], [("a", 0, 1, "decoding", 3)], [("a", 0, 1, 2, 3)],
           [("a", 0, 1, "decode", -1)], [("a", 0, 1, "decode", 1 << 31)], [("a", 0, 1, "decode", 3.0)],
           [("\ud800", 0, 1, "decode", 3)], [ok] * 5, iter([ok])]
    for spans in odd:
        ids: dict = {}
        assert pack(spans, ids, addr, 4, 0, -1) == FALLBACK, spans
    full = {f"r{i}": (b"r", 1) for i in range((1 << 14) + 1)}
    assert pack([("new", 0, 1, "decode", 0)], full, addr, 4, 0, -1) == FALLBACK
    assert pack([("a", 0, 1, "decode", 0)], {"a": "not an entry"}, addr, 4, 0, -1) == FALLBACK
    with pytest.raises(TypeError):
        pack([ok], [], addr, 4, 0, -1)
    with pytest.raises(TypeError):
        pack([ok], {}, 0, 4, 0, -1)
    with pytest.raises(TypeError):
        pack([ok], {}, addr, 4, 0)
    # The packer: more spans than its scratch grows it; a full ids dict is cleared in Python.
    p = SpanPacker()
    many = [(f"r{i}", i, i + 1, "decode", i) for i in range(100)]
    assert p.pack(many).arr["end"].tolist() == list(range(1, 101)) and len(p._scratch) >= 100
    p._ids.update(full)
    assert _records(p.pack([("new", 0, 1, "decode", 0)]))[0][0] == b"new" and len(p._ids) == 1


def test_pack_reuses_and_advances_in_place():
    """PACK_SAME and PACK_ADVANCED against the last records; new records as a bytearray that
    the packing adopts (its numpy view made when first read, writing through to the records)."""
    pack = _need_pack()
    p = SpanPacker()
    a = p.pack([("a", 0, 1, "decode", 7), ("b", 1, 3, "prefill", 0)])
    assert a._arr is None and a.rows == 3 and a.n == 2 and p.packs == 1
    assert p.pack([("a", 0, 1, "decode", 7), ("b", 1, 3, "prefill", 0)]) is a
    assert p.pack([("a", 0, 1, "decode", 8), ("b", 1, 3, "prefill", 1)]) is a and p.packs == 1
    assert a.positions.tolist() == [8, 1]
    a.positions[0] = 20  # a caller's write (hf's decode steps) is in the records the engine reads
    assert ctypes.c_int32.from_address(a.addr + S._SPAN.fields["first_position"][1]).value == 20
    scratch = np.zeros(2, dtype=S._SPAN)
    out = pack([("a", 0, 1, "decode", 20), ("b", 1, 3, "prefill", 1)], p._ids, scratch.ctypes.data, 2, a.addr, 2)
    assert out == 0  # PACK_SAME: the records now hold what was written
    out = pack([("a", 0, 1, "decode", 20)], p._ids, scratch.ctypes.data, 2, a.addr, 2)
    assert isinstance(out, tuple) and out[2] == 1 and len(out[0]) == S._SPAN.itemsize
    assert p.pack([]) is not a and p.pack([]).n == 0 and p.pack([]).addr == 0
    # Packed in Python (a numpy position), advanced in C, then the first spans again in Python:
    # packed again, never the advanced records.
    q = SpanPacker()
    first = [("a", 0, 1, "decode", np.int64(5))]
    q.pack(first)
    assert q.pack([("a", 0, 1, "decode", 6)]).positions.tolist() == [6]
    assert q.pack(first).positions.tolist() == [5]


def test_index_rows_matches_numpy():
    """index_rows gives numpy's flatnonzero of an index and the slots there, at out[:k] and
    out[k:2k] (one [2, k] block); refuses n past cap and NULL addresses."""
    _need_pack()
    INDEX_ROWS = S._ext.index_rows
    rng = np.random.default_rng(4)
    out = np.full((2, 40), -7, dtype=np.int64)
    for n in (0, 1, 5, 40):
        for density in (0.0, 0.4, 1.0):
            idx = np.where(rng.random(n) < density, rng.integers(1, 300, n), 0).astype(np.int32)
            k = INDEX_ROWS(idx.ctypes.data if n else 0, n, out.ctypes.data, 40)
            nz = np.flatnonzero(idx)
            assert k == len(nz)
            flat = out.reshape(-1)
            assert flat[:k].tolist() == nz.tolist() and flat[k:2 * k].tolist() == idx[nz].tolist()
    idx = np.ones(3, np.int32)
    with pytest.raises(ValueError):
        INDEX_ROWS(idx.ctypes.data, 3, out.ctypes.data, 2)
    with pytest.raises(ValueError):
        INDEX_ROWS(0, 3, out.ctypes.data, 40)
    with pytest.raises(ValueError):
        INDEX_ROWS(idx.ctypes.data, 3, 0, 40)
