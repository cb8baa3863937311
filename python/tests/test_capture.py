"""shmsteer.capture: a Python consumer reading a Go worker's capture ring through the C ABI."""

from __future__ import annotations

import json
import os
import subprocess
import time

import numpy as np
import pytest

import shmsteer
from shmsteer import capture
from shmsteer.capture import Begin, Consumer, End, Record

from conftest import GO_OWNER_ENV

HIDDEN = 64


class CaptureOwner:
    """The capi test binary in its capture role: an owner with a hub declaring consumer "py"
    and a worker ring, driven line by line (see capi/capture_test.go)."""

    def __init__(self, ns: str, secret: bytes, ring_bytes: int = 0) -> None:
        binary = os.environ.get(GO_OWNER_ENV)
        if not binary:
            pytest.skip(f"{GO_OWNER_ENV} not set: run through `go test ./capi -run TestPython`, which sets it")
        env = dict(os.environ, SHMSTEER_CAPI_ROLE="capture", SHMSTEER_TEST_NS=ns, SHMSTEER_SECRET=secret.decode())
        if ring_bytes:
            env["SHMSTEER_CAPTURE_RING"] = str(ring_bytes)
        self.proc = subprocess.Popen([binary], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline() == "ready\n"

    def cmd(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        out = self.proc.stdout.readline().rstrip("\n")
        assert not out.startswith("err"), out
        return out

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


@pytest.fixture
def owner(ns, secret):
    o = CaptureOwner(ns, secret)
    yield o
    o.close()


def expected(seq: int, dtype: str):
    """capi's captureRecord(seq, dtype): layer, positions and the raw elements."""
    rows = 1 + seq % 3
    j = np.arange(rows * HIDDEN)
    if dtype == "float32":
        data = (seq * 1000 + j).astype(np.float32)
    else:
        data = ((seq * 7 + j) & 0xFFFF).astype(np.uint16)
    return seq % 4, np.arange(rows, dtype=np.uint32) + 10 * seq, data.reshape(rows, HIDDEN)


def drain(c: Consumer, until_end: str):
    events = []
    for _ in range(1000):
        ev = c.next(timeout=5.0)
        assert ev is not None, "no event within 5 s"
        if isinstance(ev, Record):
            # Copy out what the test keeps: the views end at the next call.
            events.append(("record", ev.request_id, ev.layer, ev.hook, ev.dtype, ev.positions.copy(), ev.data.copy(),
                           ev.data.dtype, ev.data.flags.writeable, ev.data.flags.owndata))
        else:
            events.append(ev)
        if isinstance(ev, End) and ev.request_id == until_end:
            return events
    raise AssertionError("no end")


def test_records_are_zero_copy_views_bitwise(owner, ns, secret):
    with Consumer(ns, "py", secret=secret) as c:
        assert c.stats()["rings"] == 1
        spec = {"tag": "t", "hooks": {"post_block": "all"}}
        owner.cmd(f"begin r1 5 {json.dumps(spec)}")
        dtypes = ["float32", "bfloat16", "float16"]
        for seq in range(9):
            owner.cmd(f"append r1 {seq} {dtypes[seq % 3]}")
            owner.cmd(f"append other {seq} float32")  # not captured for py: skipped
        owner.cmd("end r1")
        events = drain(c, "r1")
        assert events[0] == Begin("r1", spec, 5)
        recs = [e for e in events if isinstance(e, tuple)]
        assert len(recs) == 9
        for seq, (_, rid, layer, hook, dtype, pos, data, npdt, writeable, owndata) in enumerate(recs):
            want_layer, want_pos, want = expected(seq, dtypes[seq % 3])
            assert (rid, layer, hook, dtype) == ("r1", want_layer, "post_block", dtypes[seq % 3])
            # bf16 is a uint16 view with its dtype named; f16 is numpy's float16.
            assert npdt == {"float32": np.float32, "bfloat16": np.uint16, "float16": np.float16}[dtype]
            assert not writeable and not owndata
            np.testing.assert_array_equal(pos, want_pos)
            assert data.tobytes() == want.tobytes()
        assert events[-1] == End("r1", 0)
        st = c.stats()
        assert st["received"] == 18 and st["skipped"] == 9 and st["dropped"] == 0
        c.publish("r1", "ok", payload=["/root/t/r1/0_post_block.bin"])
        res = json.loads(owner.cmd("result r1"))
        assert res == {"py": {"status": "ok", "error": None, "payload": ["/root/t/r1/0_post_block.bin"]}}


def test_consumer_close_ends_its_requests_with_error(owner, ns, secret):
    c = Consumer(ns, "py", secret=secret, policy=capture.DROP)
    owner.cmd('begin r2 3 {"tag": "t"}')
    assert isinstance(c.next(timeout=5.0), Begin)
    c.close()
    c.close()  # idempotent
    res = json.loads(owner.cmd("result r2"))
    assert res["py"]["status"] == "error" and "left before publishing" in res["py"]["error"]
    with pytest.raises(capture.CaptureClosedError):
        c.next()


def test_refusals_are_typed(owner, ns, secret):
    with pytest.raises(shmsteer.UnknownConsumerError):
        Consumer(ns, "nope", secret=secret)
    with pytest.raises(ValueError):
        Consumer(ns, "py", secret=secret, policy="sometimes")
    with pytest.raises(ValueError):
        Consumer(ns, "py", secret=secret, bound=-1)
    with Consumer(ns, "py", secret=secret) as c:
        with pytest.raises(shmsteer.ConsumerTakenError):
            Consumer(ns, "py", secret=secret)
        with pytest.raises(ValueError):
            c.publish("r", "pending")
        with pytest.raises(ValueError):
            c.publish("r", "ok", payload={"not": "a list"})


def test_python_owner_results(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=8, layers=2) as o:
        with pytest.raises(shmsteer.NoHubError):
            o.capture_result("r")
        capture.serve_capture(o, {"fs": "filesystem", "probe": "filesystem"})
        assert o.capture_result("never-admitted") == {
            "fs": {"status": "not_requested", "error": None, "payload": []},
            "probe": {"status": "not_requested", "error": None, "payload": []}}
        with Consumer(ns, "fs", secret=secret) as c:
            assert c.next(timeout=0.01) is None
            assert c.stats()["rings"] == 0


def test_next_batch_holds_every_view(owner, ns, secret):
    with Consumer(ns, "py", secret=secret) as c:
        owner.cmd('begin rb 2 {"tag": "t"}')
        for seq in range(12):
            owner.cmd(f"append rb {seq} float32")
        owner.cmd("end rb")
        first = c.next_batch(max_events=8, timeout=5.0)
        assert first == [Begin("rb", {"tag": "t"}, 2)]
        recs = []
        while len(recs) < 12:
            batch = c.next_batch(max_events=5, timeout=5.0)
            assert 1 <= len(batch) <= 5 and all(isinstance(r, Record) for r in batch)
            for r in batch:  # every view of the batch is valid until the next call
                _, want_pos, want = expected(len(recs), "float32")
                np.testing.assert_array_equal(r.positions, want_pos)
                assert r.data.tobytes() == want.tobytes()
                recs.append(r)
        assert c.next_batch(timeout=5.0) == [End("rb", 0)]
        with pytest.raises(ValueError):
            c.next_batch(max_events=0)


def test_python_owner_admit_end_publish(ns, secret):
    """A Python-hosted owner serving consumer "fs": admit with capture, the consumer's begin,
    the end, its published result in Owner.capture_result; a request naming "probe" while no
    probe consumer is attached ends with status error."""
    with shmsteer.Owner(ns, secret=secret, hidden=8, layers=2) as o:
        capture.serve_capture(o, {"fs": "filesystem", "probe": "filesystem"})
        spec = {"request_id": "r1", "tag": "t", "hooks": {"post_block": [1]}, "positions": "all"}
        with Consumer(ns, "fs", secret=secret) as c:
            o.admit("r1", capture={"fs": spec}, prompt_len=3)
            assert o.capture_result("r1")["fs"]["status"] == "pending"
            assert c.next(timeout=5.0) == Begin("r1", spec, 3)
            o.end("r1")
            assert c.next(timeout=5.0) == End("r1", 0)
            c.publish("r1", "partial_error", error="one site failed", payload=["/x/t/r1/1_post_block.bin"])
            for _ in range(500):  # the result crosses the consumer's connection: up to 5 s
                res = o.capture_result("r1")
                if res["fs"]["status"] != "pending":
                    break
                time.sleep(0.01)
            assert res == {"fs": {"status": "partial_error", "error": "one site failed",
                                  "payload": ["/x/t/r1/1_post_block.bin"]},
                           "probe": {"status": "not_requested", "error": None, "payload": []}}
            o.admit("r2", capture={"probe": dict(spec, request_id="r2")}, prompt_len=3)
            assert o.capture_result("r2")["probe"]["status"] == "error"
