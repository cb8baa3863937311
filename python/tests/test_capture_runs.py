"""shmsteer.capture runs: Consumer.next_run (one strided zero-copy view per run) and
Consumer.copy_run (a run's rows copied into the caller's buffer), read from a Go worker's ring
through the C ABI, bitwise against what the worker wrote (capi's burstRecord)."""

from __future__ import annotations

import ctypes
from typing import List, Tuple

import numpy as np
import pytest

import shmsteer
from shmsteer import capture
from shmsteer.capture import Begin, Consumer, End, RecordRun

from shmsteer._lib import check
from test_capture import CaptureOwner, owner  # noqa: F401 - the fixture

DTYPES = {"float32": np.uint32, "bfloat16": np.uint16}  # compared as raw bits


def burst(seed: int, reqs: int, layers: int, rows: int, width: int, dtype: str):
    """capi's burstRecord for every record k of a burst: request ids, layers, positions
    (k, rows) and the raw element bits (k, rows, width)."""
    k = np.arange(reqs * layers, dtype=np.int64)[:, None]
    j = np.arange(rows * width, dtype=np.int64)[None, :]
    v = (seed * 7919 + k * 131 + j) & 0xFFFF
    if dtype == "float32":
        bits = (v | (k << 16)).astype(np.uint32)
    else:
        bits = v.astype(np.uint16)
    ids = [f"req-{r}" for _ in range(layers) for r in range(reqs)]
    lays = np.repeat(np.arange(layers, dtype=np.int32), reqs)
    pos = (seed * 100000 + k * rows + np.arange(rows)[None, :]).astype(np.uint32)
    return ids, lays, pos, bits.reshape(-1, rows, width)


def write(owner: CaptureOwner, seed: int, reqs: int, layers: int, rows: int, width: int, dtype: str):
    owner.cmd(f"burst {reqs} {layers} {rows} {width} {dtype} {seed}")
    return burst(seed, reqs, layers, rows, width, dtype)


def collect(c: Consumer, n: int, read, copied: bool) -> Tuple[list, np.ndarray, np.ndarray, np.ndarray, List[int]]:
    """Read n records in runs (read() returns the next event), kept as copies."""
    ids: list = []
    lays, pos, data, lens = [], [], [], []
    while sum(lens) < n:
        ev = read()
        assert ev is not None, "no run within the timeout"
        if isinstance(ev, Begin):
            continue
        assert isinstance(ev, RecordRun), ev
        assert ev.hook == "post_block" and len(ev) == len(ev.request_ids) == len(ev.layers)
        assert ev.data.shape == (len(ev), ev.rows, ev.width) and ev.positions.shape == (len(ev), ev.rows)
        assert ev.data.dtype == {"float32": np.float32, "bfloat16": np.uint16}[ev.dtype]
        if not copied:
            # One zero-copy view of the ring for the whole run: strided, read-only.
            assert not ev.data.flags.writeable and not ev.data.flags.owndata and not ev.positions.flags.writeable
            assert ev.data.strides[0] == ev.positions.strides[0] >= ev.rows * ev.width * ev.data.itemsize
        r0 = ev.record(0)
        assert (r0.request_id, r0.layer, r0.hook) == (ev.request_ids[0], ev.layers[0], "post_block")
        assert r0.data.tobytes() == ev.data[0].tobytes()
        ids += ev.request_ids
        lays.append(ev.layers.copy())
        pos.append(ev.positions.copy())
        data.append(ev.data.view(DTYPES[ev.dtype]).copy())
        lens.append(len(ev))
    assert sum(lens) == n
    return ids, np.concatenate(lays), np.concatenate(pos), np.concatenate(data), lens


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mode", ["view", "copy"])
def test_runs_bitwise(ns, secret, dtype, mode):
    owner = CaptureOwner(ns, secret)
    try:
        with Consumer(ns, "py", secret=secret) as c:
            dst = np.empty(1 << 20, dtype=np.uint8)
            read = (lambda: c.next_run(max_records=40, timeout=5.0)) if mode == "view" else (
                lambda: c.copy_run(dst, max_records=40, timeout=5.0))
            for seed, rows in ((1, 1), (2, 3)):
                want = write(owner, seed, 8, 12, rows, 64, dtype)
                ids, lays, pos, data, lens = collect(c, 96, read, mode == "copy")
                assert ids == want[0]
                np.testing.assert_array_equal(lays, want[1])
                np.testing.assert_array_equal(pos, want[2])
                assert data.tobytes() == want[3].tobytes()
                assert max(lens) <= 40
            assert c.stats()["received"] == 192
    finally:
        owner.close()


def test_runs_span_the_wrap_around(ns, secret):
    """A 64 KiB ring wraps every ~190 records of 320-byte frames: view runs end before each
    wrap (their rows lie at one stride), copy runs go through it; every row is bitwise the
    worker's either way, over several wraps."""
    owner = CaptureOwner(ns, secret, ring_bytes=64 << 10)
    try:
        with Consumer(ns, "py", secret=secret) as c:
            dst = np.empty(1 << 20, dtype=np.uint8)
            for mode in ("view", "copy", "view", "copy"):
                for seed in range(3):
                    # 96 records of 256 data bytes: 30 KiB a burst, under the ring's half
                    want = write(owner, 10 + seed, 8, 12, 1, 64, "float32")
                    read = (lambda: c.next_run(max_records=96, timeout=5.0)) if mode == "view" else (
                        lambda: c.copy_run(dst, max_records=96, timeout=5.0))
                    ids, lays, pos, data, lens = collect(c, 96, read, mode == "copy")
                    assert ids == want[0]
                    np.testing.assert_array_equal(pos, want[2])
                    assert data.tobytes() == want[3].tobytes()
                    if mode == "copy":
                        assert lens == [96]  # one run, whether or not the burst wrapped
            # The bursts wrapped the ring (64 KiB) several times: 12 x 96 frames of 320 bytes.
            assert c.stats()["received"] == 12 * 96
    finally:
        owner.close()


def test_view_run_split_at_the_wrap(ns, secret):
    """A burst written across the ring's end comes as two view runs (one before the pad, one
    after), one copy run."""
    owner = CaptureOwner(ns, secret, ring_bytes=64 << 10)
    try:
        with Consumer(ns, "py", secret=secret) as c:
            dst = np.empty(1 << 20, dtype=np.uint8)
            # 150 frames of 320 bytes (48,000 of the ring's 65,536) then 96 more: the second
            # burst crosses the end.
            write(owner, 1, 10, 15, 1, 64, "float32")
            assert collect(c, 150, lambda: c.copy_run(dst, max_records=1000, timeout=5.0), True)[4] == [150]
            want = write(owner, 2, 8, 12, 1, 64, "float32")
            ids, _, pos, data, lens = collect(c, 96, lambda: c.next_run(max_records=1000, timeout=5.0), False)
            assert len(lens) == 2 and lens[0] == (65536 - 48000) // 320
            assert data.tobytes() == want[3].tobytes() and ids == want[0]
            np.testing.assert_array_equal(pos, want[2])
    finally:
        owner.close()


def test_released_view_run_is_overwritten(ns, secret):
    """What a run's views show once released: the worker reuses the space, so the old view
    reads the new rows (no error); a copy_run's data, in the caller's buffer, stays."""
    owner = CaptureOwner(ns, secret, ring_bytes=64 << 10)
    try:
        with Consumer(ns, "py", secret=secret) as c:
            want = write(owner, 1, 8, 12, 1, 64, "float32")
            first = c.next_run(max_records=8, timeout=5.0)
            while not isinstance(first, RecordRun):
                first = c.next_run(max_records=8, timeout=5.0)
            assert first.data.view(np.uint32).tobytes() == want[3][:8].tobytes()
            dst = np.empty(1 << 16, dtype=np.uint8)
            kept = c.copy_run(dst, max_records=8, timeout=5.0)  # releases `first`, then copies
            kept_bytes = kept.data.tobytes()
            assert kept.data.view(np.uint32).tobytes() == want[3][8:16].tobytes()
            c.release()
            # Two more bursts wrap the ring over the released records' space while nothing
            # holds it (the consumer reads them in between so the worker never waits).
            for seed in (2, 3, 4):
                write(owner, seed, 8, 12, 1, 64, "float32")
                collect(c, 96, lambda: c.copy_run(np.empty(1 << 16, dtype=np.uint8), max_records=96, timeout=5.0),
                        True)
            assert first.data.view(np.uint32).tobytes() != want[3][:8].tobytes()  # overwritten
            assert kept.data.tobytes() == kept_bytes  # ...but not dst, which copy_run filled
    finally:
        owner.close()


def test_run_refusals_change_nothing(owner, ns, secret):
    with Consumer(ns, "py", secret=secret) as c:
        want = write(owner, 5, 2, 2, 3, 64, "float32")  # 4 records of 3 x 64 x 4 = 768 bytes
        for bad in (0, 65537, 2.0, True):
            with pytest.raises(ValueError):
                c.next_run(max_records=bad)
        with pytest.raises(ValueError):
            c.copy_run(np.empty((8, 1024), dtype=np.uint8)[:, ::2])  # not contiguous
        with pytest.raises(ValueError):
            c.copy_run(np.empty(0, dtype=np.uint8))
        ro = np.empty(4096, dtype=np.uint8)
        ro.flags.writeable = False
        with pytest.raises(ValueError):
            c.copy_run(ro)
        assert isinstance(c.copy_run(np.empty(16, dtype=np.uint8), timeout=5.0), Begin)
        assert isinstance(c.copy_run(np.empty(16, dtype=np.uint8), timeout=5.0), Begin)
        # A buffer smaller than the next record: typed, with what it needs; nothing consumed.
        with pytest.raises(shmsteer.CaptureRunTooLargeError) as e:
            c.copy_run(np.empty(700, dtype=np.uint8), timeout=5.0)
        assert e.value.need == 768
        assert c.stats()["received"] == 0
        # The C ABI's own checks: a run of 0 or 65,537 records, NULL buffers.
        lib, ev, n = capture.lib, capture._Event(), ctypes.c_size_t(7)
        recs = np.zeros(4, dtype=capture._REC_DTYPE)
        for mx in (0, 65537):
            with pytest.raises(shmsteer.InvalidArgumentError):
                check(lib.shmsteer_capture_next_run(c._handle(), 0, ctypes.byref(ev), recs.ctypes.data,
                                                                    mx, ctypes.byref(n)))
        with pytest.raises(shmsteer.InvalidArgumentError):
            check(lib.shmsteer_capture_copy_run(c._handle(), 0, ctypes.byref(ev), recs.ctypes.data, 4,
                                                                ctypes.byref(n), None, 4096, None, 16))
        # One record's worth: a run of one (the next does not fit); then the rest.
        dst = np.empty(768 + 100, dtype=np.uint8)
        run = c.copy_run(dst, timeout=5.0)
        assert isinstance(run, RecordRun) and len(run) == 1
        assert run.data.view(np.uint32).tobytes() == want[3][0].tobytes()
        np.testing.assert_array_equal(run.positions, want[2][:1])
        rest = c.copy_run(np.empty(1 << 16, dtype=np.uint8), timeout=5.0)
        assert len(rest) == 3 and rest.data.view(np.uint32).tobytes() == want[3][1:].tobytes()
        assert rest.request_ids == want[0][1:] and list(rest.layers) == [0, 1, 1]
        assert c.stats()["received"] == 4


def test_runs_and_events_in_order(owner, ns, secret):
    """Begin before a request's runs, End after all of them, through next_run; a run stops at
    a record of another shape (rows)."""
    with Consumer(ns, "py", secret=secret) as c:
        owner.cmd('begin rq 3 {"tag": "t"}')
        for seq in range(6):
            owner.cmd(f"append rq {seq} float32")  # 1 + seq % 3 rows: every record a new shape
        owner.cmd("end rq")
        evs = []
        while not evs or not isinstance(evs[-1], End):
            ev = c.next_run(timeout=5.0)
            assert ev is not None
            evs.append(ev)
        assert evs[0] == Begin("rq", {"tag": "t"}, 3) and evs[-1] == End("rq", 0)
        runs = evs[1:-1]
        assert [len(r) for r in runs] == [1] * 6 and [r.rows for r in runs] == [1, 2, 3, 1, 2, 3]
        assert all(r.request_ids == ["rq"] for r in runs)
        assert c.next_run(timeout=0.01) is None
