"""A Python capture consumer's read bandwidth against a plain copy of the same bytes.

One decode step of issue 24's shape (64 requests capturing all positions at 32 post_block
layers, hidden 4096, float32: 2,048 records of 16 KiB, 32 MiB) is appended by a Go worker (the
capi test binary in its capture role, $SHMSTEER_GO_OWNER_BIN), then read by
shmsteer.capture.Consumer into one 32 MiB destination array, in each of the modes (--modes):

* copy:  Consumer.copy_run(dst[off:], --run records a call): the library copies each run's
         rows into dst (one call per run, no per-record Python step);
* view:  Consumer.next_run(--run): one strided zero-copy view per run, np.copyto into dst;
* batch: Consumer.next_batch(--batch): one view per record, each copied into dst in Python;
* next:  Consumer.next: one call and one copy per record.

The baseline ("memcpy") is one np.copyto of the same 32 MiB between two buffers of the same
size as the consumer's: from a shared memfd mapping (the ring's kind of memory), rewritten
untimed before each copy as the worker rewrites the ring, into the same destination. That is
the plain copy of the same bytes with no per-record step at all (numpy's memcpy, which for
32 MiB streams with non-temporal stores); a second baseline ("memcpy_records") copies them
record by record in Python, for comparison with the older figures. Rounds alternate the
contenders' order; a ratio is the median over rounds of the baseline's time over the
consumer's (its bandwidth as a fraction of memcpy's; the goal is >= 0.8), with its spread
(min and max over rounds). Every contender is timed by this thread's CPU time
(time.thread_time: the library's Go code runs on the calling thread, and the records are in
the ring before a read starts, so nothing waits), which leaves out the time the thread waits
for a core on a loaded machine; the *_wall ratios are the same by the wall clock.

    go test -c -o /tmp/capi.test ./capi && go generate ./capi
    SHMSTEER_GO_OWNER_BIN=/tmp/capi.test PYTHONPATH=python /usr/bin/python3 python/benchmarks/capture_read.py
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Callable, Dict, List, Tuple

import numpy as np

from shmsteer.capture import Begin, Consumer, Record, RecordRun


Times = Tuple[float, float]  # (thread CPU seconds, wall seconds)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--reqs", type=int, default=64)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--run", type=int, default=1024, help="records per next_run / copy_run call")
    ap.add_argument("--batch", type=int, default=256, help="events per next_batch call")
    ap.add_argument("--modes", default="copy,view,batch", help="comma-separated: copy, view, batch, next")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not set(a.modes.split(",")) <= {"copy", "view", "batch", "next"}:
        sys.exit(f"--modes {a.modes}: want copy, view, batch or next")
    return a


def start_owner() -> Tuple[subprocess.Popen, str, str]:
    """The capi test binary in its capture role; its namespace and secret."""
    binary = os.environ.get("SHMSTEER_GO_OWNER_BIN")
    if not binary:
        sys.exit("set SHMSTEER_GO_OWNER_BIN to the capi test binary (go test -c -o /tmp/capi.test ./capi)")
    ns, secret = "capbench-" + uuid.uuid4().hex, uuid.uuid4().hex
    env = dict(os.environ, SHMSTEER_CAPI_ROLE="capture", SHMSTEER_TEST_NS=ns, SHMSTEER_SECRET=secret)
    p = subprocess.Popen([binary], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "ready\n"
    return p, ns, secret


def now() -> Times:
    return time.thread_time(), time.perf_counter()


def since(t0: Times) -> Times:
    return time.thread_time() - t0[0], time.perf_counter() - t0[1]


class Bench:
    """The contenders: a consumer reading one step the owner p appends, and the baselines."""

    def __init__(self, a: argparse.Namespace, p: subprocess.Popen, c: Consumer) -> None:
        self.a, self.p, self.c = a, p, c
        self.n, self.rec_bytes = a.reqs * a.layers, a.width * 4
        self.step = self.n * self.rec_bytes
        self.dst = np.empty(self.step, dtype=np.uint8)
        self.dst[:] = 1  # its pages faulted in before any round
        fd = os.memfd_create("capbench")
        os.ftruncate(fd, self.step)
        self.src = np.frombuffer(mmap.mmap(fd, self.step), dtype=np.uint8)
        self.pattern = np.arange(self.rec_bytes, dtype=np.uint8)

    def cmd(self, line: str) -> None:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline()
        assert out == "ok\n", out

    def read(self, mode: str) -> Times:
        a, c, dst = self.a, self.c, self.dst
        self.cmd(f"step {a.reqs} {a.layers} {a.width}")
        t0 = now()
        off = got = 0
        while got < self.n:
            if mode == "copy":
                run = c.copy_run(dst[off:], max_records=a.run, timeout=5.0)
                if isinstance(run, RecordRun):
                    off += run.data.nbytes
                    got += len(run)
                continue
            if mode == "view":
                run = c.next_run(max_records=a.run, timeout=5.0)
                if isinstance(run, RecordRun):
                    m = run.data.nbytes
                    np.copyto(dst[off:off + m].view(run.data.dtype).reshape(run.data.shape), run.data)
                    off += m
                    got += len(run)
                continue
            evs = c.next_batch(a.batch, timeout=5.0) if mode == "batch" else [c.next(timeout=5.0)]
            for ev in evs:
                if isinstance(ev, Begin):
                    continue
                assert isinstance(ev, Record), ev
                d = ev.data.view(np.uint8).reshape(-1)
                dst[off:off + d.size] = d
                off += d.size
                got += 1
        c.release()
        assert got == self.n and off == self.step, (got, off)
        return since(t0)

    def fresh(self) -> None:
        for o in range(0, self.step, self.rec_bytes):  # rewritten as the worker writes the ring
            self.src[o:o + self.rec_bytes] = self.pattern

    def memcpy(self) -> Times:  # one copy of the same bytes, no per-record step
        self.fresh()
        t0 = now()
        np.copyto(self.dst, self.src)
        return since(t0)

    def memcpy_records(self) -> Times:
        self.fresh()
        t0 = now()
        for o in range(0, self.step, self.rec_bytes):
            self.dst[o:o + self.rec_bytes] = self.src[o:o + self.rec_bytes]
        return since(t0)

    def rounds(self, modes: List[str]) -> Dict[str, List[Times]]:
        """Every contender's times over --rounds rounds, the order rotated each round."""
        for m in modes:
            self.read(m)  # warm-up: the begins, the ring's pages
        contenders: Dict[str, Callable[[], Times]] = {m: (lambda m=m: self.read(m)) for m in modes}
        contenders["memcpy"], contenders["memcpy_records"] = self.memcpy, self.memcpy_records
        times: Dict[str, List[Times]] = {k: [] for k in contenders}
        names = list(contenders)
        for i in range(self.a.rounds):
            k = i % len(names)
            for name in names[k:] + names[:k]:
                times[name].append(contenders[name]())
        return times


def report(a: argparse.Namespace, modes: List[str], times: Dict[str, List[Times]], n: int, step: int) -> dict:
    def spread(x: list) -> list:
        return [round(statistics.median(x), 3), round(min(x), 3), round(max(x), 3)]

    def cpu(name: str) -> list:
        return [t[0] for t in times[name]]

    def wall(name: str) -> list:
        return [t[1] for t in times[name]]

    base, base_r = cpu("memcpy"), cpu("memcpy_records")
    res = {"records_per_step": n, "bytes_per_step": step, "rounds": a.rounds, "run": a.run, "batch": a.batch,
           "baseline": "one np.copyto of the same bytes from a shared memfd mapping of the same size",
           "clock": "thread CPU time (time.thread_time); *_wall: wall clock",
           "memcpy_gb_s": round(step / statistics.median(base) / 1e9, 3),
           "memcpy_records_gb_s": round(step / statistics.median(base_r) / 1e9, 3)}
    for m in modes:
        t = cpu(m)
        res[f"{m}_gb_s"] = round(step / statistics.median(t) / 1e9, 3)
        res[f"{m}_over_memcpy"] = spread([b / r for b, r in zip(base, t)])  # median, min, max
        res[f"{m}_over_memcpy_wall"] = spread([b / r for b, r in zip(wall("memcpy"), wall(m))])
        res[f"{m}_over_memcpy_records"] = spread([b / r for b, r in zip(base_r, t)])
    return res


def main() -> None:
    a = parse_args()
    modes = a.modes.split(",")
    p, ns, secret = start_owner()
    with Consumer(ns, "py", secret=secret.encode()) as c:
        b = Bench(a, p, c)
        times = b.rounds(modes)
    p.stdin.close()
    p.wait(timeout=10)
    res = report(a, modes, times, b.n, b.step)
    print(json.dumps(res) if a.json else "\n".join(f"{k}: {v}" for k, v in res.items()))


if __name__ == "__main__":
    main()
