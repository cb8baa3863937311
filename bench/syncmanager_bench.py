"""The seed design's key store, measured for `shmsteer bench`.

A multiprocessing SyncManager (with an authkey) serves a manager.dict() from
its own process; a worker process started with the "spawn" method, as the
seed's vLLM workers were, gets and sets 36-character keys with 32-byte bytes
values through the DictProxy. Each get or set is one request/response to the
manager process, which is the cost being measured.

Driven by bench/python.go with the round protocol of bench/child.go:
usage: syncmanager_bench.py NKEYS VALUE_SIZE, then on stdin "get N" / "set N"
per round; each answer is one JSON line {"ns": total} timed in the worker with
time.perf_counter_ns around the N operations only. EOF ends it.
"""

import itertools
import json
import multiprocessing as mp
import os
import sys
import time
import uuid
from multiprocessing.managers import SyncManager


def die_with_parent():
    # Linux only: have the kernel kill this helper if the process that
    # started it dies, so a killed bench leaves no manager or worker behind.
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def worker(d, keys, value, conn):
    die_with_parent()
    while True:
        msg = conn.recv()
        if msg is None:
            return
        op, n = msg
        try:
            it = itertools.islice(itertools.cycle(keys), n)
            if op == "get":
                t0 = time.perf_counter_ns()
                for k in it:
                    d[k]
                t1 = time.perf_counter_ns()
            elif op == "set":
                t0 = time.perf_counter_ns()
                for k in it:
                    d[k] = value
                t1 = time.perf_counter_ns()
            else:
                conn.send({"error": "unknown op %r" % op})
                continue
            conn.send({"ns": t1 - t0})
        except Exception as e:  # reported to Go as a skip reason
            conn.send({"error": repr(e)})


def main():
    nkeys, vsize = int(sys.argv[1]), int(sys.argv[2])
    ctx = mp.get_context("spawn")
    mgr = SyncManager(authkey=os.urandom(16), ctx=ctx)
    mgr.start(initializer=die_with_parent)
    proc = None
    try:
        d = mgr.dict()
        keys = [str(uuid.uuid4()) for _ in range(nkeys)]
        d.update({k: os.urandom(vsize) for k in keys})
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker, args=(d, keys, os.urandom(vsize), child), daemon=True)
        proc.start()
        # A first get proves the worker reached the manager with the authkey.
        parent.send(("get", 1))
        first = parent.recv()
        if "error" in first:
            print(json.dumps(first), flush=True)
            return 1
        info = "python %s, %s" % (sys.version.split()[0], sys.executable)
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
        if proc is not None:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        mgr.shutdown()


if __name__ == "__main__":
    sys.exit(main())
