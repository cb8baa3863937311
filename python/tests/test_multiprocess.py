"""Multi-process tests: a Go owner with Python workers, a Python owner with spawned Python
workers, a worker SIGKILLed mid-read, the owner SIGKILLed, and a forked child."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

import shmsteer
from shmsteer import errors

import workers


def test_go_owner_python_workers(go_owner, ns, secret, spawn):
    q = spawn.Queue()
    procs = [spawn.Process(target=workers.read_go_fixture, args=(ns, secret, q)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    for r in results:
        assert r["key"] == bytes(range(32))
        assert r["revoked"]
        hook, layer, total, mapping = r["vec"]
        assert (hook, layer) == ("post_block", 1)
        assert total == pytest.approx(sum(i * 0.25 for i in range(64)))
        assert mapping.startswith("/memfd:shmsteer-data")
    with shmsteer.Client(ns, secret=secret) as c:
        assert sum(1 for k in c.keys if k.startswith("from-worker-")) == 2


def _start_python_owner(spawn, ns, secret):
    ready, stop = spawn.Event(), spawn.Event()
    p = spawn.Process(target=workers.python_owner, args=(ns, secret, ready, stop))
    p.start()
    assert ready.wait(60), "owner did not start"
    return p, stop


def test_python_owner_killed_readers_keep_reading(spawn, ns, secret):
    owner, _ = _start_python_owner(spawn, ns, secret)
    with shmsteer.Client(ns, secret=secret) as c:
        assert c.keys["k1"] == b"value-1"
        c.keys["k2"] = b"value-2"
        os.kill(owner.pid, signal.SIGKILL)
        owner.join(30)
        # Reads keep working on the last state...
        for _ in range(100):
            assert c.keys["k1"] == b"value-1"
            assert c.keys["k2"] == b"value-2"
        with c.snapshot() as s:
            assert float(s.vector("v").entries[0].data.sum()) == 16.0
        # ...writes raise the owner-gone error.
        with pytest.raises(errors.OwnerGoneError):
            for _ in range(50):  # the socket's close may take a moment to be seen
                c.keys["k3"] = b"x"
                time.sleep(0.05)
        with pytest.raises(errors.OwnerGoneError):
            c.ping()


def _wait_slots_freed(o, base: int) -> None:
    """Wait (20 s at most) for the owner to free a dead worker's reader slots, back to base."""
    deadline = time.time() + 20
    while o.status()["region"]["ReadersClaimed"] > base and time.time() < deadline:
        time.sleep(0.05)
    assert o.status()["region"]["ReadersClaimed"] == base, "the dead worker's reader slots"


def test_worker_sigkilled_mid_read(spawn, ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=16, layers=2) as o:
        o.keys["k1"] = b"value-1"
        o.register_vector("v", [("post_block", 0, 1.0, [1.0] * 16)])
        o.status()
        base = o.status()["region"]["ReadersClaimed"]  # the owner's own pooled slots
        started = spawn.Event()
        w = spawn.Process(target=workers.keep_reading, args=(ns, secret, started))
        w.start()
        assert started.wait(60)
        os.kill(w.pid, signal.SIGKILL)
        w.join(30)
        assert w.exitcode == -signal.SIGKILL
        # The owner frees the dead worker's reader slots; writes and reclamation go on.
        _wait_slots_freed(o, base)
        for i in range(50):
            o.register_vector("v", [("post_block", 0, 1.0, [float(i)] * 16)])
        with shmsteer.Client(ns, secret=secret) as c:
            with c.snapshot() as s:
                assert float(s.vector("v").entries[0].data.sum()) == 49.0 * 16
            assert c.keys["k1"] == b"value-1"


def test_forked_child_gets_forked_error_not_a_hang(ns, secret):
    with shmsteer.Owner(ns, secret=secret) as o:
        o.keys["k"] = b"v"
        pid = os.fork()
        if pid == 0:  # the child: every call must fail fast with ForkedError
            code = 1
            try:
                o.keys["k"]
            except errors.ForkedError as e:
                code = 0 if "spawn" in str(e) else 2
            except BaseException:
                code = 3
            os._exit(code)
        assert workers.wait_forked(pid) == 0
        assert o.keys["k"] == b"v"  # the parent is unaffected


def test_go_owner_sigkilled_and_wrong_secret(go_owner, ns, secret):
    with pytest.raises(errors.AuthFailedError):
        shmsteer.Client(ns, secret=b"not-the-secret")
    with shmsteer.Client(ns, secret=secret) as c:
        go_owner.kill()  # SIGKILL
        go_owner.wait(10)
        for _ in range(100):
            assert c.keys["req-1"] == bytes(range(32))
        with pytest.raises(errors.OwnerGoneError):
            for _ in range(50):
                c.keys["late"] = b"x"
                time.sleep(0.05)
        # A new attach finds no owner.
        with pytest.raises(errors.NotYetInitializedError):
            shmsteer.Client(ns, secret=secret)


def test_native_worker_sigkilled_mid_step(spawn, ns, secret):
    """A worker whose steady native steps begin and end in C (holding the version's pin there)
    is SIGKILLed at random points: the owner frees its reader slots each time, writes and
    reclaims on, and a new worker steers with the latest vectors."""
    pytest.importorskip("torch")
    rng = random.Random(7)
    with shmsteer.Owner(ns, secret=secret, hidden=16, layers=2) as o:
        o.register_vector("v", [("post_block", 0, 1.0, [1.0] * 16), ("post_block", 1, 1.0, [1.0] * 16)])
        over = {"decode": {"refs": [{"name": "v", "strength": 1.0}]}}
        for i in range(3):
            o.admit("r%d" % i, override=over)
        base = o.status()["region"]["ReadersClaimed"]
        for round_ in range(3):
            started = spawn.Event()
            w = spawn.Process(target=workers.native_steps, args=(ns, secret, started))
            w.start()
            assert started.wait(60)
            time.sleep(rng.uniform(0, 0.05))
            os.kill(w.pid, signal.SIGKILL)
            w.join(30)
            assert w.exitcode == -signal.SIGKILL
            _wait_slots_freed(o, base)
            for k in range(20):  # writes and reclamation go on past the dead pins
                o.register_vector("v", [("post_block", 0, 1.0, [float(k)] * 16), ("post_block", 1, 1.0, [float(k)] * 16)])
        for i in range(3):
            o.admit("r%d" % i, override=over)  # composed from the latest "v"
        q, ran = spawn.Queue(), spawn.Event()  # kept: the child unpickles them after start()
        w = spawn.Process(target=workers.native_steps, args=(ns, secret, ran, q))
        w.start()
        total, checksum = q.get(timeout=120)
        w.join(30)
        assert w.exitcode == 0
        assert total == 19.0 * 16 * 2 * 3  # 3 rows, both layers add the latest (19.0 each)
        assert checksum != 0
