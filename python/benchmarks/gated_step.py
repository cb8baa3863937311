"""A gated decode step on the device path against the same step ungated, in one run.

Shape (issue 23's bench, as steer's BenchmarkGatedDecode): 32 layers x post_block, hidden 4096,
64 decode rows of 64 requests, each with its own decode steering at every layer; gated, every
request also carries a this_token probe gate (probe at post_block 16, an add of a named vector at
post_block 17-20) and a next_step attenuation on the same probe. Contenders: the eager device path
and the static (CUDA-graph) mode on float32 CPU tensors (gated: ``max_row_gates=2`` and
``gate_sites`` post_block 16-20, where the gates probe and add; ungated: no gate work compiled in),
each ungated and gated, so a gated step pays the engine's resolve and report and the hooks' probe dots, sigmoids
and gated adds on the same tensor work a GPU would do; with a CUDA device the same on it.
Contenders run interleaved, round by round in a shuffled order; CPU ones are timed by the
thread's CPU time, CUDA ones by wall time after a synchronize. Reported: the median ms per step
(and its range over the rounds), each gated contender's ratio to its ungated twin of the same
run (ratio of the medians) and the median (and range) of its per-round ratios.

    /usr/bin/python3 python/benchmarks/gated_step.py [--rounds 15] [--steps 10] [--json]
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

HIDDEN, LAYERS, ROWS = 4096, 32, 64


class Chain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Identity() for _ in range(LAYERS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def vec(seed: int) -> np.ndarray:
    return ((np.arange(HIDDEN) + seed * 31) % 97 / 97 - 0.5).astype(np.float32)


def setup(owner: shmsteer.Owner) -> None:
    owner.register_vector("p", [("post_block", 16, 1.0, vec(7))], kind="probe")
    owner.register_vector("s", [("post_block", l, 1.0, vec(l)) for l in range(17, 21)])
    probe = {"kind": "probe", "probe": {"kind": "name", "name": "p"}, "threshold": 0, "sharpness": 1}
    gates = [{"when": probe, "scope": "this_token", "apply": {"kind": "add", "steer": {"kind": "name", "name": "s"}, "strength": 0.5}},
             {"when": probe, "scope": "next_step", "apply": {"kind": "attenuate", "strength": 0.5}}]
    for gated in (False, True):
        for r in range(ROWS):
            own = [{"hook": "post_block", "layer": l, "scale": 1e-3, "data": vec(1000 + r * LAYERS + l).tolist()} for l in range(LAYERS)]
            owner.admit(f"{'g' if gated else 'u'}-{r}", override={"decode": {"vectors": own}}, steering=gates if gated else None)


def steered(owner: shmsteer.Owner, spans, **kw) -> Callable[[torch.Tensor], None]:
    hooks = SteeringHooks(owner, **kw)
    chain = Chain()
    for l, b in enumerate(chain.blocks):
        hooks.attach(b, "post_block", l)
    if hooks.static:
        def step(x: torch.Tensor) -> None:
            hooks.prepare(spans)
            with torch.no_grad():
                chain(x)
            hooks.report()
    else:
        def step(x: torch.Tensor) -> None:
            with torch.no_grad(), hooks.step(spans):
                chain(x)
    step.hooks = hooks  # type: ignore[attr-defined]
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ns, secret = "bench-" + uuid.uuid4().hex, uuid.uuid4().hex.encode()
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS, arena_bytes=512 << 20) as owner:
        setup(owner)
        spans = {g: [(f"{'g' if g else 'u'}-{r}", r, r + 1, "decode") for r in range(ROWS)] for g in (False, True)}
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        contenders: Dict[str, Callable[[torch.Tensor], None]] = {}
        inputs: Dict[str, torch.Tensor] = {}
        x0 = torch.from_numpy(np.stack([vec(r) for r in range(ROWS)]))  # rows whose probe scores differ
        for dev in devices:
            sfx = "" if dev == "cpu" else "-cuda"
            for gated in (False, True):
                name = "gated" if gated else "ungated"
                contenders[f"device-{name}{sfx}"] = steered(owner, spans[gated], force_device_path=True)
                gk = dict(max_row_gates=2, gate_sites=[("post_block", l) for l in range(16, 21)]) if gated else {}
                contenders[f"static-{name}{sfx}"] = steered(owner, spans[gated], static=True, max_tokens=ROWS, device=dev,
                                                            dtype=torch.float32, max_clamps=0, **gk)
            for k in contenders:
                inputs.setdefault(k, x0.to(dev))
        for k, step in contenders.items():  # warm-up: tables made, rows uploaded, pulses engaged
            for _ in range(3):
                step(inputs[k].clone())
        times: Dict[str, List[float]] = {k: [] for k in contenders}
        order = list(contenders)
        shuffle = np.random.default_rng(7)
        for _ in range(args.rounds):
            shuffle.shuffle(order)
            for k in order:
                step, x = contenders[k], inputs[k]
                cuda = x.device.type == "cuda"
                clock = time.perf_counter if cuda else time.thread_time
                xs = [x.clone() for _ in range(args.steps)]
                if cuda:
                    torch.cuda.synchronize()
                t0 = clock()
                for xi in xs:
                    step(xi)
                if cuda:
                    torch.cuda.synchronize()
                times[k].append((clock() - t0) * 1e3 / args.steps)
        med = {k: statistics.median(v) for k, v in times.items()}
        spread = {k: [min(v), max(v)] for k, v in times.items()}
        ratio = {k: med[k] / med[k.replace("-gated", "-ungated")] for k in med if "-gated" in k}
        per_round = {k: [g / u for g, u in zip(times[k], times[k.replace("-gated", "-ungated")])] for k in ratio}
        round_ratio = {k: statistics.median(v) for k, v in per_round.items()}
        round_spread = {k: [min(v), max(v)] for k, v in per_round.items()}
        fires = {k: step.hooks.stepper.stats()["gate_fires"] for k, step in contenders.items() if "-gated" in k}
        report = {"shape": {"layers": LAYERS, "hook": "post_block", "hidden": HIDDEN, "rows": ROWS, "dtype": "float32",
                            "gates": "this_token probe add at 17-20 + next_step attenuation, every request"},
                  "rounds": args.rounds, "steps_per_round": args.steps, "ms_per_step_median": med,
                  "ms_per_step_min_max": spread, "gated_over_ungated": ratio,
                  "gated_over_ungated_per_round_median": round_ratio, "gated_over_ungated_per_round_min_max": round_spread,
                  "gate_fires": fires, "goal": 1.15}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"{LAYERS} layers x post_block, hidden {HIDDEN}, {ROWS} decode rows of {ROWS} requests; "
          f"{args.rounds} rounds x {args.steps} steps, interleaved")
    for k in contenders:
        r = ratio.get(k)
        line = f"  {k:22s} {med[k]:8.3f} ms/step ({spread[k][0]:.3f}-{spread[k][1]:.3f})"
        if r is not None:
            lo, hi = round_spread[k]
            line += f"  {r:5.2f}x ungated (per round: median {round_ratio[k]:.2f}x, {lo:.2f}-{hi:.2f})"
        print(line)
    print("  goal (issue 43): gated <= 1.15x ungated (ratio of medians and median of per-round ratios)")


if __name__ == "__main__":
    main()
