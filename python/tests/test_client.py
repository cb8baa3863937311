"""In-process tests of the package: an Owner and Clients in this process."""

from __future__ import annotations

import gc
import pathlib
import re
import time

import numpy as np
import pytest

import shmsteer
from shmsteer import _lib, errors
from workers import mapping_of


def test_error_classes_mirror_library_codes():
    # Every code the library names has exactly the class whose Go name it reports.
    named = {c: _lib.error_name(c) for c in range(1, 256) if _lib.error_name(c)}  # past SHMSTEER_E_LIMIT
    assert named == {c: cls.go_name for c, cls in errors.BY_CODE.items()}
    assert issubclass(errors.KeyNotFoundError, KeyError)
    assert issubclass(errors.OwnerGoneError, ConnectionError)
    assert issubclass(errors.IncompatibleError, errors.LayoutIncompatibleError)


@pytest.fixture
def owner(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=8, layers=2, grace=60) as o:
        yield o


def test_keys_mapping(owner, ns, secret):
    with shmsteer.Client(ns, secret=secret) as c:
        owner.keys["a"] = b"\x00key-a"
        c.keys["b"] = b"key-b"  # an RPC to the owner
        assert c.keys["a"] == b"\x00key-a"
        assert owner.keys["b"] == b"key-b"
        assert sorted(c.keys) == ["a", "b"] and len(c.keys) == 2
        del c.keys["a"]
        with pytest.raises(errors.KeyRevokedError):
            c.keys["a"]
        assert "a" in c.keys  # its sentinel stands until the purge
        with pytest.raises(errors.KeyNotFoundError):
            c.keys["never"]
        assert c.keys.get("never") is None
        # A client lists live keys; the owner also lists revoked ids (sentinels are hashes).
        assert dict(c.keys.entries()) == {"b": False}
        assert dict(owner.keys.entries()) == {"a": True, "b": False}
        # A key larger than the default buffer comes back whole.
        big = bytes(range(256)) * 15
        owner.keys["big"] = big
        assert c.keys["big"] == big
        with pytest.raises(errors.KeyTooLargeError):
            c.keys["huge"] = b"x" * 5000
        with pytest.raises(errors.RequestIDTooLongError):
            c.keys["x" * 300] = b"k"


def test_snapshot_pins_a_version_and_views_alias_the_mapping(owner, ns, secret):
    v1 = np.arange(8, dtype=np.float32)
    owner.register_vector("dir", [("post_block", 1, 0.5, v1)])
    with shmsteer.Client(ns, secret=secret) as c:
        old = c.snapshot()
        c.register_vector("dir", [("post_block", 1, 1.0, v1 * 2)])
        with c.snapshot() as new:
            nv = new.vector("dir")
            e = nv.entries[0]
            assert (e.hook, e.layer, e.scale) == ("post_block", 1, 1.0)
            np.testing.assert_array_equal(e.data, v1 * 2)
            # Zero bytes copied: the view's data lies in the shared data mapping.
            assert mapping_of(e.data.ctypes.data).startswith("/memfd:shmsteer-data")
            assert not e.data.flags.writeable
            with pytest.raises(ValueError):
                e.data[0] = 1
            with pytest.raises(ValueError):
                e.data.flags.writeable = True
            assert [x["name"] for x in new.vectors()] == ["dir"]
            assert len(nv.digest) == 32
        # The older snapshot still sees the older vector.
        o = old.vector("dir").entries[0]
        np.testing.assert_array_equal(o.data, v1)
        assert o.scale == 0.5
        del o, e, nv  # views keep their snapshot pinned (and the client busy)
        old.close()
        with pytest.raises(errors.ClosedError):
            old.vector("dir")
        with c.snapshot() as s:
            with pytest.raises(errors.UnknownVectorError):
                s.vector("nope")


def test_closing_a_snapshot_with_live_views_defers_the_unpin(owner, ns, secret):
    owner.register_vector("dir", [("post_block", 0, 1.0, np.ones(8, np.float32))])
    with shmsteer.Client(ns, secret=secret) as c:
        def pinned_slots():
            return c.status()["region"]["ReadersPinned"]
        gc.collect()
        base = pinned_slots()
        snap = c.snapshot()
        view = snap.vector("dir").entries[0].data
        part = view[2:5]  # slices keep the pin too
        del view
        snap.close()
        assert snap.closed and snap.pinned
        assert pinned_slots() == base + 1
        assert float(part.sum()) == 3.0  # still valid memory
        del part
        gc.collect()
        assert not snap.pinned
        assert pinned_slots() == base


def test_pinning_a_version_the_scheduler_hands_out(owner, ns, secret):
    owner.register_vector("dir", [("post_block", 0, 1.0, np.ones(8, np.float32))])
    with owner.snapshot() as hold:  # some process holds the version, so others can pin it
        v = hold.version
        owner.register_vector("dir", [("post_block", 0, 1.0, np.zeros(8, np.float32))])
        with shmsteer.Client(ns, secret=secret) as c:
            with c.snapshot(v) as s:
                assert s.version == v
                assert float(s.vector("dir").entries[0].data.sum()) == 8.0
            with pytest.raises(errors.SnapshotFutureError):
                c.snapshot(owner.version + 10)


def test_attach_errors(owner, ns, secret, monkeypatch, tmp_path):
    with pytest.raises(errors.AuthFailedError):
        shmsteer.Client(ns, secret=b"wrong")
    monkeypatch.delenv("SHMSTEER_SECRET", raising=False)
    with pytest.raises(errors.AuthSecretNotDefinedError):
        shmsteer.Client(ns)
    with pytest.raises(errors.NotYetInitializedError):
        shmsteer.Client(ns + "-other", secret=secret)
    with pytest.raises(errors.PreviouslyInitializedError):
        shmsteer.Owner(ns, secret=secret)
    f = tmp_path / "secret"
    f.write_bytes(secret + b"\n")
    with shmsteer.Client(ns, secret_file=str(f)) as c:
        c.ping()
    monkeypatch.setenv("SHMSTEER_SECRET", secret.decode())
    with shmsteer.Client(ns) as c:
        c.ping()


def test_closed_handles(owner, ns, secret):
    c = shmsteer.Client(ns, secret=secret)
    c.close()
    c.close()  # idempotent
    with pytest.raises(errors.ClosedError):
        c.keys["a"]
    # A raw stale handle is refused, not reused.
    with pytest.raises(errors.BadHandleError):
        _lib.check(_lib.lib.shmsteer_ping(owner.handle + (1 << 40)))


def test_stepper_on_numpy_rows(owner, ns, secret):
    d = 8
    vec = np.arange(d, dtype=np.float32)
    owner.register_vector("n", [("post_block", 1, 1.0, vec)])
    owner.admit("r1", override={"decode": {"refs": [{"name": "n", "strength": 2.0}]}})
    with shmsteer.Client(ns, secret=secret) as c, c.stepper() as st:
        rows = np.ones((3, d), np.float32)
        before_ptr = rows.ctypes.data
        st.begin()
        st.apply("post_block", 1, rows, [("r1", 0, 2, "decode"), ("r2", 2, 3, "decode")])
        eff = st.effective("r1", "post_block", 1, "decode")
        checksum = st.end()
        assert rows.ctypes.data == before_ptr
        np.testing.assert_allclose(rows[:2], np.broadcast_to(1 + 2 * vec, (2, d)))
        np.testing.assert_array_equal(rows[2], np.ones(d))
        assert checksum != 0
        assert eff.clamps == 0 and len(eff.digest) == 32
        with pytest.raises(errors.NoStepError):
            st.apply("post_block", 1, rows, [])
        st.begin()
        with pytest.raises(errors.BadBatchError):
            st.apply("post_block", 1, rows, [("r1", 0, 9, "decode")])
        with pytest.raises(errors.LayerRangeError):
            st.apply("post_block", 7, rows, [])
        with pytest.raises(errors.ShapeError):
            st.apply("post_block", 1, np.ones(5, np.float32), [])
        with pytest.raises(TypeError):
            st.apply("post_block", 1, np.ones((1, d)), [])
        st.end()


def test_stepper_bound_batch_matches_apply(owner, ns, secret):
    # bind + apply_bound: the same floats and checksum as apply with the batch at every site.
    d = 8
    rng = np.random.default_rng(3)
    for layer in range(2):
        owner.register_vector(f"b{layer}", [("post_block", layer, 1.0, rng.standard_normal(d).astype(np.float32))])
    owner.admit("r1", override={"decode": {"refs": [{"name": "b0", "strength": 2.0}, {"name": "b1", "strength": -1.0}]}})
    owner.admit("r2", override={"base": {"refs": [{"name": "b1", "strength": 0.5}]}})
    spans = [("r1", 0, 1, "decode"), ("r2", 1, 2, "decode"), ("r3", 2, 3, "decode")]
    h0 = rng.standard_normal((3, d)).astype(np.float32)
    with shmsteer.Client(ns, secret=secret) as c, c.stepper() as a, c.stepper() as b:
        ra, rb = h0.copy(), h0.copy()
        a.begin()
        b.begin()
        b.bind(spans, 3)
        spans[0] = ("r2", 0, 1, "decode")  # bind copied the batch
        for layer in range(2):
            a.apply("post_block", layer, ra, [("r1", 0, 1, "decode"), ("r2", 1, 2, "decode"), ("r3", 2, 3, "decode")])
            b.apply_bound("post_block", layer, rb)
        assert a.end() == b.end() != 0
        np.testing.assert_array_equal(ra, rb)
        assert not np.array_equal(rb[:2], h0[:2])
        np.testing.assert_array_equal(rb[2], h0[2])

        with pytest.raises(errors.NoStepError):
            b.bind(spans, 3)
        b.begin()
        with pytest.raises(errors.NoStepError):
            b.apply_bound("post_block", 0, rb)
        with pytest.raises(errors.BadBatchError):
            b.bind([("r1", 0, 9, "decode")], 3)
        with pytest.raises(errors.NoStepError):
            b.apply_bound("post_block", 0, rb)
        b.bind(b.spans(spans), 3)  # packed spans
        with pytest.raises(errors.ShapeError):
            b.apply_bound("post_block", 0, rb[:2])
        with pytest.raises(errors.LayerRangeError):
            b.apply_bound("post_block", 7, rb)
        with pytest.raises(errors.InvalidArgumentError):
            b.bind(spans, -1)
        np.testing.assert_array_equal(ra, rb)
        b.end()


def test_worker_sets_global_through_a_python_owner(owner, ns, secret):
    # A Python-hosted owner serves every write a worker sends, global steering included.
    d = 8
    vec = np.arange(d, dtype=np.float32)
    owner.admit("r1")
    with shmsteer.Client(ns, secret=secret) as c:
        v = c.set_global({"base": {"vectors": [{"hook": "post_block", "layer": 1, "scale": 1.0,
                                                "data": vec.tolist()}]}})
        assert v <= owner.version
        with c.stepper() as st:
            rows = np.ones((1, d), np.float32)
            st.begin(v)
            st.apply("post_block", 1, rows, [("r1", 0, 1, "decode")])
            st.end()
        np.testing.assert_allclose(rows[0], 1 + vec)
        with pytest.raises(errors.HiddenSizeError):
            c.set_global({"base": {"vectors": [{"hook": "post_block", "layer": 1, "scale": 1.0, "data": [1.0]}]}})
        c.set_global({})
        with c.stepper() as st:
            rows = np.ones((1, d), np.float32)
            st.begin()
            st.apply("post_block", 1, rows, [("r1", 0, 1, "decode")])
            st.end()
        np.testing.assert_array_equal(rows[0], np.ones(d))


def test_key_get_fast_path_edges(ns, secret):
    with shmsteer.Owner(ns, secret=secret, max_key_bytes=20000) as o, shmsteer.Client(ns, secret=secret) as c:
        big = bytes(range(256)) * 40  # longer than the thread's C key buffer (8 KiB)
        o.keys["big"] = big
        assert c.keys["big"] == big
        o.keys["a\x00b"] = b"nul-id"  # an id the C-string fast path cannot carry
        o.keys["a"] = b"not this one"
        assert c.keys["a\x00b"] == b"nul-id"
        o.keys["empty"] = b""
        assert c.keys["empty"] == b""
        assert c.keys[b"a"] == b"not this one"
        with pytest.raises(errors.RequestIDTooLongError):
            c.keys[""]


def test_key_gets_see_every_write_at_once(owner, ns, secret):
    # A client's gets go through its thread's own reader (answered in C for live keys): each
    # write and each revocation by the owner is seen by the very next get.
    with shmsteer.Client(ns, secret=secret) as c:
        for i in range(200):
            owner.keys["r"] = b"v%d" % i
            assert c.keys["r"] == b"v%d" % i
            if i % 50 == 0:
                del owner.keys["r"]
                with pytest.raises(errors.KeyRevokedError):
                    c.keys["r"]


def test_thread_readers_are_bounded_and_given_back(owner, ns, secret):
    # Region reader slots are shared by every process: one Keys opens at most THREAD_READERS of
    # them for its threads (later threads read through the handle's shared slots), and a
    # thread's slot goes back when the thread ends.
    import gc
    import threading
    from shmsteer import client as cl
    owner.keys["b"] = b"v"
    with shmsteer.Client(ns, secret=secret) as c:
        hold, all_read = threading.Event(), threading.Barrier(41)
        seen = []

        def run():
            seen.append(c.keys["b"])
            all_read.wait(10)
            hold.wait(10)
        ts = [threading.Thread(target=run, daemon=True) for _ in range(40)]
        for t in ts:
            t.start()
        all_read.wait(10)
        n = c.keys._readers[0]
        hold.set()
        for t in ts:
            t.join()
        gc.collect()
        assert n == cl.THREAD_READERS
        assert c.keys._readers[0] == 0
        assert seen == [b"v"] * 40


def test_keys_from_many_threads(owner, ns, secret):
    import threading
    owner.keys.update({f"t{i}": f"v{i}".encode() for i in range(8)})
    with shmsteer.Client(ns, secret=secret) as c:
        bad = []

        def run(i):
            for _ in range(2000):
                if c.keys[f"t{i}"] != f"v{i}".encode():
                    bad.append(i)
        ts = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not bad


def _within(seconds: float, fn):
    """Run fn in a thread; fail if it has not returned after seconds (it used to spin for ever)."""
    import threading
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"did not return within {seconds} s (spinning?)"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def test_views_holding_every_snapshot_slot_raise_no_reader_slot(owner, ns, secret):
    # Views keep their snapshot pinned: 64 live views use every slot a process pins at once, and
    # the next read fails with NoReaderSlotError at once instead of spinning.
    owner.register_vector("dir", [("post_block", 0, 1.0, np.ones(8, np.float32))])
    owner.keys["req"] = b"k"
    with shmsteer.Client(ns, secret=secret) as c:
        views = []
        for _ in range(64):
            with c.snapshot() as s:
                views.append(s.vector("dir").entries[0].data)
        with pytest.raises(errors.NoReaderSlotError, match="open snapshots"):
            _within(10, c.snapshot)
        # Key gets read through a reader slot of the thread's own (shmsteer_reader_open), not
        # one of the 64 the process pins snapshots in: they go on working.
        assert _within(10, lambda: c.keys["req"]) == b"k"
        views.pop()
        gc.collect()
        with c.snapshot():
            pass
        del views
        gc.collect()


def test_clamp_strength_outside_unit_interval_is_refused(owner):
    # The one clamp rule (strength in [0, 1]) holds through the C ABI too: a 9e29 vector plus
    # a clamp of strength 9e29 would write -inf into the row.
    clamp = {"hook": "post_block", "layer": 1, "dir": [1.0] + [0.0] * 7, "min": 1.0, "max": 1.0}
    base = {"vectors": [{"hook": "post_block", "layer": 1, "scale": 1.0, "data": [9e29] * 8}]}
    for strength in (9e29, 1.5, -0.5):
        bad = {"base": dict(base, clamps=[dict(clamp, strength=strength)])}
        with pytest.raises(errors.BadClampError, match=r"not in \[0, 1\]"):
            owner.set_global(bad)
        with pytest.raises(errors.BadClampError):
            owner.admit("rc", override=bad)
    owner.set_global({"base": dict(base, clamps=[dict(clamp, strength=1.0)])})


def test_secret_file_one_rule(owner, ns, secret, monkeypatch, tmp_path):
    # The library reads secret files with Go's one reader: one trailing "\n" or "\r\n" stripped,
    # SHMSTEER_SECRET_FILE honoured, a secret given twice refused.
    crlf = tmp_path / "crlf"
    crlf.write_bytes(secret + b"\r\n")
    with shmsteer.Client(ns, secret_file=str(crlf)) as c:
        c.ping()
    two = tmp_path / "two"
    two.write_bytes(secret + b"\n\n")  # the secret is secret + "\n": not the owner's
    with pytest.raises(errors.AuthFailedError):
        shmsteer.Client(ns, secret_file=str(two))
    monkeypatch.delenv("SHMSTEER_SECRET", raising=False)
    monkeypatch.setenv("SHMSTEER_SECRET_FILE", str(crlf))
    with shmsteer.Client(ns) as c:
        c.ping()
    monkeypatch.setenv("SHMSTEER_SECRET", secret.decode())
    with pytest.raises(errors.SecretConflictError):
        shmsteer.Client(ns)
    monkeypatch.delenv("SHMSTEER_SECRET")
    with pytest.raises(errors.SecretConflictError):
        shmsteer.Client(ns, secret=secret, secret_file=str(crlf))
    monkeypatch.setenv("SHMSTEER_SECRET_FILE", str(tmp_path / "missing"))
    with pytest.raises(errors.SecretFileError):
        shmsteer.Client(ns)


def test_integers_are_range_checked(owner, ns, secret):
    # ctypes keeps only an integer's low bits: layer 2**32+3 was registered at layer 3 and
    # hidden=2**32+8 became 8. Every integer is checked against its C type's range first.
    v = np.ones(8, np.float32)
    for bad in (2**32 + 3, 2**31, -(2**31) - 1, True, 1.0, "1"):
        with pytest.raises(errors.InvalidArgumentError):
            owner.register_vector("v", [("post_block", bad, 1.0, v)])
    with pytest.raises(errors.UnknownVectorError):
        with owner.snapshot() as s:
            s.vector("v")  # nothing was registered
    owner.register_vector("v", [("post_block", np.int64(1), 1.0, v)])  # numpy integers are integers
    with pytest.raises(errors.InvalidArgumentError, match="hidden"):
        shmsteer.Owner(ns + "-h", secret=secret, hidden=2**32 + 8)
    with pytest.raises(errors.InvalidArgumentError, match="grace"):
        shmsteer.Owner(ns + "-g", secret=secret, hidden=8, grace=float("nan"))
    with pytest.raises(errors.InvalidArgumentError):
        owner.hook_id(2**32)
    with pytest.raises(errors.InvalidArgumentError):
        owner.snapshot(2**64)  # was pinned as version 0, the current one
    with pytest.raises(errors.InvalidArgumentError):
        owner.snapshot(-1)
    with pytest.raises(errors.InvalidArgumentError, match="timeout"):
        shmsteer.Client(ns, secret=secret, timeout=float("inf"))
    rows = np.zeros((2, 8), np.float32)
    with owner.stepper() as st:
        with pytest.raises(errors.InvalidArgumentError):
            st.begin(-1)
        st.begin()
        with pytest.raises(errors.InvalidArgumentError):
            st.apply("post_block", 2**32, rows, [])
        with pytest.raises(errors.InvalidArgumentError, match="span 0 end"):
            st.apply("post_block", 0, rows, [("r", 0, 2**63, "decode")])
        st.end()


def test_key_values_must_be_bytes_like(owner):
    # bytes(12) is 12 zero bytes, bytes([1, 2]) a list's values: refused, nothing stored.
    for bad in (12, "text", [1, 2], None, 1.5):
        with pytest.raises(TypeError, match="bytes-like"):
            owner.keys["k"] = bad
    assert "k" not in owner.keys
    owner.keys["a"] = bytearray(b"ab")
    owner.keys["b"] = memoryview(b"xyz")[1:]
    owner.keys["c"] = np.frombuffer(b"\x01\x02", np.uint8)
    assert (owner.keys["a"], owner.keys["b"], owner.keys["c"]) == (b"ab", b"yz", b"\x01\x02")


def test_stepper_used_from_threads_raises_busy(owner):
    # A Stepper used from 4 threads at once used to abort the interpreter; now a call that finds
    # another thread inside raises StepperBusyError and changes nothing.
    import threading
    st = owner.stepper()
    rows = np.zeros((4096, 8), np.float32)

    # A step held open by another thread: this thread's calls are refused, whatever the timing.
    opened, release = threading.Event(), threading.Event()

    def holder():
        st.begin()
        opened.set()
        release.wait(30)
        st.end()
    h = threading.Thread(target=holder)
    h.start()
    assert opened.wait(30)
    with pytest.raises(shmsteer.StepperBusyError):
        st.apply("post_block", 0, rows, [])
    with pytest.raises(shmsteer.StepperBusyError):
        st.begin()
    release.set()
    h.join(30)
    st.begin()  # free again once the other thread ended its step
    st.apply("post_block", 0, rows, [])
    st.end()

    # Four threads at once: every call either runs or is refused; none aborts or fails otherwise
    # (how often they collide depends on the scheduler, so only the outcome is checked).
    busy, other, done = [0], [], [0]
    lock = threading.Lock()

    def run():
        for _ in range(300):
            try:
                st.begin()
                st.apply("post_block", 0, rows, [])
                st.end()
                with lock:
                    done[0] += 1
            except shmsteer.StepperBusyError:
                with lock:
                    busy[0] += 1
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    other.append(repr(e))
    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not other, other[:3]
    assert done[0] > 0 and done[0] + busy[0] == 4 * 300, (busy[0], done[0])
    st.close()
    with pytest.raises(errors.ClosedError):
        st.begin()


def test_overlapping_spans_are_bad_batch(owner):
    # A row belongs to one request: spans sharing a row are refused (the row used to get both
    # requests' steering) and the rows are unchanged.
    owner.set_global({"base": {"vectors": [{"hook": "post_block", "layer": 0, "scale": 1.0, "data": [1.0] * 8}]}})
    rows = np.zeros((4, 8), np.float32)
    with owner.stepper() as st:
        st.begin()
        with pytest.raises(errors.BadBatchError, match="overlaps"):
            st.apply("post_block", 0, rows, [("a", 0, 2, "decode"), ("b", 1, 3, "decode")])
        assert not rows.any()
        st.apply("post_block", 0, rows, [("a", 2, 4, "decode"), ("b", 0, 2, "decode")])
        assert (rows == 1).all()
        st.end()


def test_closing_a_client_with_live_views_neither_blocks_nor_raises(owner, ns, secret):
    # A view outliving its client's `with` block: the close returns at once (it used to wait 5 s
    # and raise BusyError), the view stays valid, and the library handle closes with the last view.
    owner.register_vector("dir", [("post_block", 0, 1.0, np.ones(8, np.float32))])
    t0 = time.monotonic()
    with shmsteer.Client(ns, secret=secret) as c:
        with c.snapshot() as snap:
            v = snap.vector("dir").entries[0].data
    assert time.monotonic() - t0 < 2
    with pytest.raises(errors.ClosedError):
        c.snapshot()
    life = c._life
    assert not life.closed, "the mapping outlives the client while a view lives"
    assert float(v.sum()) == 8.0
    del v, snap
    gc.collect()
    assert life.closed
    c.close()  # idempotent after the deferred close


def test_readme_worker_snippet_runs_as_written(owner, ns, secret, monkeypatch):
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"```python\n(from shmsteer import Client\nwith Client\(namespace=\"llm\"\).*?)```", readme, re.S)
    assert block, "the README's worker snippet moved: change this test with it"
    owner.register_vector("honesty", [("post_block", 0, 1.0, np.ones(8, np.float32))])
    owner.keys["req-1"] = b"k" * 16
    monkeypatch.setenv("SHMSTEER_SECRET", secret.decode())
    scope = {"request_id": "req-1", "version": owner.version}
    t0 = time.monotonic()
    exec(block.group(1).replace('namespace="llm"', f'namespace="{ns}"'), scope)  # noqa: S102 - the README's own text
    assert time.monotonic() - t0 < 2
    assert scope["key"] == b"k" * 16
    assert float(scope["v"].sum()) == 8.0
