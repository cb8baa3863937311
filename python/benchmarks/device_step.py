"""Steering cost per step: native CPU kernels, the device path on CPU tensors, the device path in
static (CUDA-graph) mode, and the plain torch gather-add a runner would otherwise write, in one run.

Shape (issue 20): 32 layers x post_block, hidden 4096, 64 decode rows of 64 requests, each
referencing one of 16 named vectors, plus a global base tier at every layer; float32 CPU tensors
(the device path on CPU tensors pays exactly the host work a GPU worker pays; the gather-add
itself then runs on the CPU too). The baseline is the fastest of three plain torch forward hooks
over a prebuilt table of the composed rows, with no engine at all: ``index_add`` (the reference
fork's ``out.index_add_(0, rows, table.index_select(0, idx))``), ``gather_add``
(``torch.index_select(table, 0, idx, out=buf)`` into a preallocated buffer, then ``out.add_(buf)``)
and ``adv_index`` (``out += table[idx]``); each contender's ratio is to the fastest one's median
of the same run.

CPU contenders are timed by the thread's CPU time (``--wall`` for wall time), CUDA ones by wall
time. Contenders run interleaved, round by round and in a shuffled order, so they share the machine's
noise; each round times ``--steps`` steps. Reported: the median ms per step over the rounds, each contender's ratio to the
baseline's median of the same run, and the engine calls per step (resolve/begin/end; the native
path also makes one kernel call per site). With a CUDA device the device path and static mode
are also timed on it.

    /usr/bin/python3 python/benchmarks/device_step.py [--rounds 15] [--steps 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from typing import Callable, Dict, List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import shmsteer  # noqa: E402
from shmsteer.torch_hook import SteeringHooks  # noqa: E402

HIDDEN, LAYERS, ROWS, NAMED = 4096, 32, 64, 16


class Chain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Identity() for _ in range(LAYERS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def setup(owner: shmsteer.Owner) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    named = {}
    for i in range(NAMED):
        data = [(rng.standard_normal(HIDDEN) * 0.01).astype(np.float32) for _ in range(LAYERS)]
        owner.register_vector(f"v{i}", [("post_block", l, 1.0, data[l]) for l in range(LAYERS)])
        named[f"v{i}"] = np.stack(data)
    g = [(rng.standard_normal(HIDDEN) * 0.01).astype(np.float32) for _ in range(LAYERS)]
    owner.set_global({"base": {"vectors": [{"hook": "post_block", "layer": l, "scale": 1.0, "data": g[l].tolist()}
                                           for l in range(LAYERS)]}})
    named["global"] = np.stack(g)
    for r in range(ROWS):
        owner.admit(f"req-{r}", override={"decode": {"refs": [{"name": f"v{r % NAMED}", "strength": 1.0}]}})
    return named


BASELINES = ("index_add", "gather_add", "adv_index")


def baseline(chain: Chain, named: Dict[str, np.ndarray], device: str, how: str = "index_add") -> Callable[[torch.Tensor], None]:
    """A plain torch gather-add with prebuilt tables (row 0 zeros, row 1+i = global + named i),
    written ``how`` (one of BASELINES)."""
    tables = []
    for l in range(LAYERS):
        t = np.zeros((NAMED + 1, HIDDEN), np.float32)
        for i in range(NAMED):
            t[1 + i] = named["global"][l] + named[f"v{i}"][l]
        tables.append(torch.from_numpy(t).to(device))
    rows = torch.arange(ROWS, device=device)
    idx = torch.tensor([1 + r % NAMED for r in range(ROWS)], device=device)
    buf = torch.empty(ROWS, HIDDEN, device=device)
    for l, b in enumerate(chain.blocks):
        if how == "index_add":
            def fn(_m, _i, out, table=tables[l]):
                out.index_add_(0, rows, table.index_select(0, idx))
        elif how == "gather_add":
            def fn(_m, _i, out, table=tables[l]):
                torch.index_select(table, 0, idx, out=buf)
                out.add_(buf)
        else:
            def fn(_m, _i, out, table=tables[l]):
                out += table[idx]
        b.register_forward_hook(fn)

    def step(x: torch.Tensor) -> None:
        with torch.no_grad():
            chain(x)
    return step


def steered(owner: shmsteer.Owner, chain: Chain, spans, **kw) -> Callable[[torch.Tensor], None]:
    hooks = SteeringHooks(owner, **kw)
    for l, b in enumerate(chain.blocks):
        hooks.attach(b, "post_block", l)
    if hooks.static:
        def step(x: torch.Tensor) -> None:
            hooks.prepare(spans)
            with torch.no_grad():
                chain(x)
    else:
        def step(x: torch.Tensor) -> None:
            with torch.no_grad(), hooks.step(spans):
                chain(x)
    step.hooks = hooks  # type: ignore[attr-defined]
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--wall", action="store_true", help="time CPU contenders by wall clock, not thread CPU time")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ns, secret = "bench-" + uuid.uuid4().hex, uuid.uuid4().hex.encode()
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS, arena_bytes=512 << 20) as owner:
        named = setup(owner)
        spans = [(f"req-{r}", r, r + 1, "decode") for r in range(ROWS)]
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        contenders: Dict[str, Callable[[torch.Tensor], None]] = {}
        inputs: Dict[str, torch.Tensor] = {}
        for dev in devices:
            sfx = "" if dev == "cpu" else "-cuda"
            for how in BASELINES:
                contenders[f"torch-{how}{sfx}"] = baseline(Chain(), named, dev, how)
            if dev == "cpu":
                contenders["native"] = steered(owner, Chain(), spans)
            contenders["device" + sfx] = steered(owner, Chain(), spans, force_device_path=True)
            contenders["static" + sfx] = steered(owner, Chain(), spans, static=True, max_tokens=ROWS, device=dev,
                                                 dtype=torch.float32, max_clamps=0)
            for k in contenders:
                inputs.setdefault(k, torch.zeros(ROWS, HIDDEN, device=dev))
        # Warm-up (tables made, rows uploaded once), and a check that every contender adds the
        # same steering as the baseline.
        outs = {}
        for k, step in contenders.items():
            x = torch.zeros(ROWS, HIDDEN, device=inputs[k].device)
            step(x)
            outs[k] = x.cpu()
        for k, o in outs.items():
            torch.testing.assert_close(o, outs["torch-index_add"], rtol=0, atol=1e-6, msg=f"{k} differs from the baseline")
        times: Dict[str, List[float]] = {k: [] for k in contenders}
        calls = {}
        for k, step in contenders.items():
            h = getattr(step, "hooks", None)
            if h is not None:
                calls[k] = h.engine_calls
        order = list(contenders)
        shuffle = np.random.default_rng(7)
        for _ in range(args.rounds):
            shuffle.shuffle(order)  # no contender always follows the same one
            for k in order:
                step, x = contenders[k], inputs[k]
                cuda = x.device.type == "cuda"
                # CPU contenders: this thread's CPU time (torch runs on one thread here), which
                # time spent descheduled by other processes on a shared machine does not inflate;
                # CUDA ones: wall time after a synchronize.
                clock = time.perf_counter if cuda or args.wall else time.thread_time
                if cuda:
                    torch.cuda.synchronize()
                t0 = clock()
                for _ in range(args.steps):
                    step(x)
                if cuda:
                    torch.cuda.synchronize()
                times[k].append((clock() - t0) * 1e3 / args.steps)
        med = {k: statistics.median(v) for k, v in times.items()}
        fastest = {}  # per device: the fastest plain torch hook, the baseline
        for sfx in ("", "-cuda"):
            names = [f"torch-{how}{sfx}" for how in BASELINES if f"torch-{how}{sfx}" in med]
            if names:
                best = min(names, key=lambda k: med[k])
                fastest["baseline" + sfx] = best
                med["baseline" + sfx] = med[best]
        per_step = {}
        for k, step in contenders.items():
            h = getattr(step, "hooks", None)
            if h is not None:
                per_step[k] = (h.engine_calls - calls[k]) / (args.rounds * args.steps)
        # Library calls that are not engine resolution: the native path's kernel call per site.
        kernel_calls = {"native": LAYERS} if "native" in contenders else {}
        report = {"shape": {"layers": LAYERS, "hook": "post_block", "hidden": HIDDEN, "rows": ROWS, "requests": ROWS,
                            "named": NAMED, "global": True, "dtype": "float32"},
                  "rounds": args.rounds, "steps_per_round": args.steps, "clock": "wall" if args.wall else "thread_cpu",
                  "baseline_is": fastest,
                  "ms_per_step_median": med,
                  "ratio_to_baseline": {k: med[k] / med["baseline" + ("-cuda" if k.endswith("-cuda") else "")] for k in med},
                  "engine_calls_per_step": per_step,
                  "kernel_calls_per_step": kernel_calls,
                  "goals": {"native": 1.05, "device": 1.10, "engine_calls_per_step": 2}}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"{LAYERS} layers x post_block, hidden {HIDDEN}, {ROWS} decode rows of {ROWS} requests over {NAMED} "
          f"named vectors + global; {args.rounds} rounds x {args.steps} steps, interleaved; "
          f"{'wall' if args.wall else 'thread CPU'} time")
    print("  baseline: the fastest plain torch hook, " + ", ".join(f"{k} = {v}" for k, v in fastest.items()))
    for k in contenders:
        ratio = report["ratio_to_baseline"][k]
        c = per_step.get(k)
        print(f"  {k:14s} {med[k]:8.3f} ms/step  {ratio:5.2f}x baseline"
              + (f"  {c:.1f} engine calls/step" if c is not None else "")
              + (f" + {kernel_calls[k]} kernel calls" if k in kernel_calls else ""))
    print("  goals: native <= 1.05x, device on CPU <= 1.10x, engine calls per step <= 2")


if __name__ == "__main__":
    main()
