"""keys.get.python_ns and keys.get.python_ctypes_ns for `shmsteer bench`: a key get from a Python
worker process through the shmsteer package (python/shmsteer over libshmsteer.so): op "get" is
the package's own `keys[id]` (its _fastkeys extension when built, else ctypes;
$SHMSTEER_KEYS_CTYPES=1 forces ctypes; the ready line's info says which), op "getctypes" the same
loop through the package's ctypes path (shmsteer.keys.new_keys(client, fast=False)). The ready
line's info names the path each op's gets took in the worker (op_path); bench puts it in the
figures' notes (python.go).

The main process hosts the owner (shmsteer.Owner, as the seed's main process hosts its manager)
and stores NKEYS 36-character keys with VALUE_SIZE-byte values; a worker started with the
"spawn" method attaches (shmsteer.Client) and gets keys round-robin with `keys[id]`, the same
loop as syncmanager_bench.py's `d[k]`.

usage: python_keys_bench.py NKEYS VALUE_SIZE PACKAGE_PARENT_DIR, then the round protocol of
bench/child.go on stdin ("get N", "getctypes N"); EOF ends it.
"""

import itertools
import json
import multiprocessing as mp
import os
import sys
import time
import uuid


def die_with_parent():
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def op_path(shmsteer, keys):
    """The path this thread's gets through keys (a shmsteer Keys it has read from) take: the
    extension's C slot or the ctypes call, and a reader of the thread's own (whose gets of live
    keys the library's C reader answers) or the handle's shared slots (the Go reader)."""
    if type(keys) is not shmsteer.keys.Keys:
        call = "the _fastkeys extension"
    elif shmsteer.keys.FAST_KEYS:
        call = "ctypes"
    else:
        call = "ctypes (the extension is not in use: %s)" % shmsteer.keys.FAST_KEYS_REASON
    _, own = keys._thread_handle()
    if own:
        return call + ", through the thread's reader (the C reader answers live keys)"
    return call + ", through the handle's shared slots (no reader slot was free: the Go reader)"


def worker(pkg_dir, ns, secret, keys, conn):
    die_with_parent()
    sys.path.insert(0, pkg_dir)
    import shmsteer

    c = shmsteer.Client(ns, secret=secret)
    maps = {"get": c.keys, "getctypes": shmsteer.keys.new_keys(c, fast=False)}
    while True:
        msg = conn.recv()
        if msg is None:
            c.close()
            return
        op, n = msg
        if op == "paths":  # after a get of each op: the path each took in this thread
            conn.send({"paths": {name: op_path(shmsteer, d) for name, d in maps.items()}})
            continue
        try:
            it = itertools.islice(itertools.cycle(keys), n)
            d = maps.get(op)
            if d is None:
                conn.send({"error": "unknown op %r" % op})
                continue
            t0 = time.perf_counter_ns()
            for k in it:
                d[k]
            t1 = time.perf_counter_ns()
            conn.send({"ns": t1 - t0})
        except Exception as e:
            conn.send({"error": repr(e)})


def main():
    nkeys, vsize, pkg_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    sys.path.insert(0, pkg_dir)
    try:
        import shmsteer
    except Exception as e:  # reported to Go as the skip reason
        print(json.dumps({"error": "import shmsteer from %s: %r" % (pkg_dir, e)}), flush=True)
        return 1
    ns, secret = "bench-" + uuid.uuid4().hex, os.urandom(16).hex()
    owner = shmsteer.Owner(ns, secret=secret)
    keys = [str(uuid.uuid4()) for _ in range(nkeys)]
    for k in keys:
        owner.keys[k] = os.urandom(vsize)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=worker, args=(pkg_dir, ns, secret, keys, child), daemon=True)
    proc.start()
    try:
        for op in ("get", "getctypes", "paths"):  # one get of each op, then the paths they took
            parent.send((op, 1))
            first = parent.recv()
            if "error" in first:
                print(json.dumps(first), flush=True)
                return 1
        paths = "".join("; op %s: %s" % (op, p.replace(";", ",")) for op, p in sorted(first["paths"].items()))
        info = "python %s, %s%s" % (sys.version.split()[0], sys.executable, paths)
        print(json.dumps({"ready": True, "info": info}), flush=True)
        for line in sys.stdin:
            f = line.split()
            if not f:
                continue
            if f[0] == "quit":
                break
            if len(f) != 2 or not f[1].isdigit():
                print(json.dumps({"error": "bad command %r" % line}), flush=True)
                continue
            parent.send((f[0], int(f[1])))
            print(json.dumps(parent.recv()), flush=True)
        parent.send(None)
        return 0
    finally:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()
        owner.close()


if __name__ == "__main__":
    sys.exit(main())
