"""Worker process bodies for the multi-process tests (importable by spawned children)."""

from __future__ import annotations

import os
import signal
import time
from typing import Optional


def mapping_of(address: int) -> Optional[str]:
    """The /proc/self/maps pathname of the mapping holding ``address`` (a view's data
    lies in the ``/memfd:shmsteer-data`` mapping)."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi:
                return parts[5].strip() if len(parts) > 5 else ""
    return None


def read_go_fixture(ns: str, secret: bytes, q) -> None:
    """Attach, check the Go owner's fixture, report what was read."""
    import numpy as np

    import shmsteer
    out = {}
    with shmsteer.Client(ns, secret=secret) as c:
        out["key"] = c.keys["req-1"]
        try:
            c.keys["req-1-revoked"]
        except shmsteer.KeyRevokedError:
            out["revoked"] = True
        with c.snapshot() as s:
            v = s.vector("v1")
            e = v.entries[0]
            out["vec"] = (e.hook, e.layer, float(np.sum(e.data)), mapping_of(e.data.ctypes.data))
            del e, v
        c.keys["from-worker-%d" % os.getpid()] = b"w"
    q.put(out)


def python_owner(ns: str, secret: bytes, ready, stop) -> None:
    """A Python main process hosting the owner until `stop` is set (or it is killed)."""
    import shmsteer
    o = shmsteer.Owner(ns, secret=secret, hidden=16, layers=2, grace=60)
    o.keys["k1"] = b"value-1"
    o.register_vector("v", [("post_block", 0, 1.0, [1.0] * 16)])
    ready.set()
    stop.wait(60)
    o.close()


def keep_reading(ns: str, secret: bytes, started) -> None:
    """Read keys and vector views in a loop, holding snapshots, until killed."""
    import shmsteer
    c = shmsteer.Client(ns, secret=secret)
    n = 0
    while True:
        with c.snapshot() as s:
            v = s.vector("v")
            float(v.entries[0].data.sum())
            c.keys["k1"]
            n += 1
            if n == 100:
                started.set()
            del v


def registry_child(request_id: str, q) -> None:
    """Seed-style child: read a key set by the main process, write one of its own."""
    from shmsteer.keyregistry import get_shared_registry
    reg = get_shared_registry()
    q.put(("read", request_id, reg[request_id]))
    reg["child-" + request_id] = ("from-" + request_id).encode()
    q.put(("wrote", request_id, None))


def registry_child_missing(q) -> None:
    """Seed-style child with no manager running."""
    from shmsteer.keyregistry import KeyRegistryNotYetInitializedError, get_shared_registry
    try:
        get_shared_registry()
        q.put("no error")
    except KeyRegistryNotYetInitializedError:
        q.put("not yet initialized")


def timed_gets(ns: str, secret: bytes, n: int, q) -> None:
    """Time n key gets through the package in this (spawned) process; reports ns per get."""
    import shmsteer
    with shmsteer.Client(ns, secret=secret) as c:
        keys = c.keys
        get = keys.get_bytes
        for _ in range(1000):
            get("bench-key")
        best = None
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                get("bench-key")
            dt = (time.perf_counter_ns() - t0) / n
            best = dt if best is None else min(best, dt)
        q.put(best)


def gated_device_worker(ns: str, secret: bytes, name: str, q) -> None:
    """A worker on the device path (SteeringHooks, CPU tensors forced onto it): three decode
    steps of request r1 (row 0 trips the probe at post_block 0, row 1 does not), then its gate
    counts reported to serve as ``name``; puts its stepper's stats on q."""
    try:
        import torch
        import shmsteer
        from shmsteer.torch_hook import SteeringHooks
        with shmsteer.Client(ns, secret=secret) as c:
            hidden = c.model[0]
            hooks = SteeringHooks(c, force_device_path=True)
            mods = [torch.nn.Identity() for _ in range(2)]
            for layer, m in enumerate(mods):
                hooks.attach(m, "post_block", layer)
            for _ in range(3):
                x = torch.zeros(2, hidden)
                x[:, 0] = torch.tensor([0.9, 0.3])
                with torch.no_grad(), hooks.step([("r1", 0, 2, "decode")]):
                    for m in mods:
                        x = m(x)
            hooks.stepper.report_gates(name)
            q.put(hooks.stepper.stats())
            hooks.close()
    except Exception as e:  # pragma: no cover - reported to the parent
        q.put(repr(e))


def wait_forked(pid: int, seconds: float = 20) -> int:
    """The exit code of forked child ``pid``; SIGKILLs it and raises AssertionError if it has not
    exited after ``seconds`` (a forked child must fail fast, never hang)."""
    deadline = time.time() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.time() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("forked child hung")
        time.sleep(0.01)


def native_steps(ns: str, secret: bytes, started, q=None) -> None:
    """Step a steady decode batch through native hooks (its steps begin and end in C, pinning
    the region's version there) until killed; with q, run 200 steps and report the last
    output's sum and the hooks' checksum instead."""
    import torch

    import shmsteer
    from shmsteer.torch_hook import SteeringHooks
    c = shmsteer.Client(ns, secret=secret)
    hooks = SteeringHooks(c)
    blocks = torch.nn.ModuleList([torch.nn.Identity() for _ in range(2)])
    for layer, b in enumerate(blocks):
        hooks.attach(b, "post_block", layer)
    n = 0
    out = torch.zeros(0)
    while q is None or n < 200:
        x = torch.zeros(3, 16, dtype=torch.bfloat16)
        spans = [("r%d" % i, i, i + 1, "decode", 10 + n) for i in range(3)]
        with torch.no_grad(), hooks.step(spans):
            out = x
            for b in blocks:
                out = b(out)
        n += 1
        if n == 100:
            started.set()
    q.put((float(out.float().sum()), hooks.checksum))
