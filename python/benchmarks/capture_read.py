"""A Python capture consumer's read bandwidth against a plain copy of the same bytes.

One decode step of issue 24's shape (64 requests capturing all positions at 32 post_block
layers, hidden 4096, float32: 2,048 records of 16 KiB, 32 MiB) is appended by a Go worker (the
capi test binary in its capture role, $SHMSTEER_GO_OWNER_BIN), then read by
shmsteer.capture.Consumer (next_batch, --batch events a call; --batch 1: next): each record's
zero-copy numpy view copied into a destination array.
The baseline copies the same bytes, record by record, out of a shared memfd mapping rewritten
(untimed) just before, as the worker rewrites the ring (and, second, in one 32 MiB np.copyto).
Rounds alternate the order; a ratio is the median over rounds of the baseline's time over the
consumer's (the goal is >= 0.8 against the record-by-record copy).

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

import numpy as np

from shmsteer.capture import Begin, Consumer, Record


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--reqs", type=int, default=64)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=256, help="events per next_batch call (1: next)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    binary = os.environ.get("SHMSTEER_GO_OWNER_BIN")
    if not binary:
        sys.exit("set SHMSTEER_GO_OWNER_BIN to the capi test binary (go test -c -o /tmp/capi.test ./capi)")
    ns, secret = "capbench-" + uuid.uuid4().hex, uuid.uuid4().hex
    env = dict(os.environ, SHMSTEER_CAPI_ROLE="capture", SHMSTEER_TEST_NS=ns, SHMSTEER_SECRET=secret)
    p = subprocess.Popen([binary], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "ready\n"

    def cmd(line: str) -> None:
        p.stdin.write(line + "\n")
        p.stdin.flush()
        out = p.stdout.readline()
        assert out == "ok\n", out

    n, rec_bytes = a.reqs * a.layers, a.width * 4
    step = n * rec_bytes
    dst = np.empty(step, dtype=np.uint8)
    fd = os.memfd_create("capbench")
    os.ftruncate(fd, step)
    src = np.frombuffer(mmap.mmap(fd, step), dtype=np.uint8)
    pattern = np.arange(rec_bytes, dtype=np.uint8)
    with Consumer(ns, "py", secret=secret.encode()) as c:
        def read() -> float:
            cmd(f"step {a.reqs} {a.layers} {a.width}")
            t0 = time.perf_counter()
            off = got = 0
            while got < n:
                evs = c.next_batch(a.batch, timeout=5.0) if a.batch > 1 else [c.next(timeout=5.0)]
                for ev in evs:
                    if isinstance(ev, Begin):
                        continue
                    assert isinstance(ev, Record), ev
                    d = ev.data.view(np.uint8).reshape(-1)
                    dst[off:off + d.size] = d
                    off += d.size
                    got += 1
            c.release()
            return time.perf_counter() - t0

        def fresh() -> None:
            for o in range(0, step, rec_bytes):  # rewritten as the worker writes the ring
                src[o:o + rec_bytes] = pattern

        def base() -> float:
            fresh()
            t0 = time.perf_counter()
            for o in range(0, step, rec_bytes):
                dst[o:o + rec_bytes] = src[o:o + rec_bytes]
            return time.perf_counter() - t0

        def base1() -> float:  # one 32 MiB copy, no per-record Python step
            fresh()
            t0 = time.perf_counter()
            np.copyto(dst, src)
            return time.perf_counter() - t0

        read()  # warm-up: the begins, the ring's pages
        ratios, ratios1, tr, tb = [], [], [], []
        for i in range(a.rounds):
            if i % 2 == 0:
                r, b, b1 = read(), base(), base1()
            else:
                b1, b, r = base1(), base(), read()
            tr.append(r)
            tb.append(b)
            ratios.append(b / r)
            ratios1.append(b1 / r)
    p.stdin.close()
    p.wait(timeout=10)
    res = {"batch": a.batch, "records_per_step": n, "bytes_per_step": step, "rounds": a.rounds,
           "consumer_gb_s_median": step / statistics.median(tr) / 1e9,
           "memcpy_gb_s_median": step / statistics.median(tb) / 1e9,
           "consumer_over_memcpy_median": statistics.median(ratios),
           "consumer_over_one_copy_median": statistics.median(ratios1)}
    print(json.dumps(res) if a.json else "\n".join(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}" for k, v in res.items()))


if __name__ == "__main__":
    main()
