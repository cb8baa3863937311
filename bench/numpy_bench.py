"""numpy's steering add h += s*v, measured for `shmsteer bench`.

h is a (T, D) float32 array of hidden states and v a D-long float32 steering
vector; the op adds s*v to every row in place, broadcast over T.

Driven by bench/python.go with the round protocol of bench/child.go:
usage: numpy_bench.py D TAG:T [TAG:T ...], then on stdin "add.TAG N" per
round; each answer is one JSON line {"ns": total} timed with
time.perf_counter_ns around the N adds only. EOF ends it.
"""

import json
import sys
import time

import numpy as np


def main():
    d = int(sys.argv[1])
    rng = np.random.default_rng(6)
    v = rng.uniform(-1.0, 1.0, d).astype(np.float32)
    s = np.float32(0.5)
    # s*v allocates a D-long temporary; a user applying a constant steering
    # vector computes it once, so it is hoisted out of the timed loop and the
    # loop is numpy's best plain form: one in-place broadcast add with no
    # temporaries. It is the same ufunc as `h += sv`; calling np.add with a
    # positional out skips the operator and keyword dispatch, which is ~30%
    # of the time at T=1 and nothing at large T.
    sv = s * v
    add = np.add
    hs = {}
    for spec in sys.argv[2:]:
        tag, t = spec.split(":")
        h = np.empty((int(t), d), dtype=np.float32)
        h.fill(0.25)  # touch every page now, not inside the first round
        hs["add." + tag] = h
    info = "numpy %s, python %s, %s" % (np.__version__, sys.version.split()[0], sys.executable)
    print(json.dumps({"ready": True, "info": info}), flush=True)
    for line in sys.stdin:
        f = line.split()
        if not f:
            continue
        if f[0] == "quit":
            break
        h = hs.get(f[0])
        if h is None or len(f) != 2 or not f[1].isdigit():
            print(json.dumps({"error": "bad command %r" % line}), flush=True)
            continue
        n = int(f[1])
        t0 = time.perf_counter_ns()
        for _ in range(n):
            add(h, sv, h)
        t1 = time.perf_counter_ns()
        print(json.dumps({"ns": t1 - t0}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
