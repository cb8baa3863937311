"""Steering's cost in a serving loop: a small decoder with a KV cache under continuous batching.

The loop (issue 43): a 4-block decoder (hidden 256, 4 heads, an MLP of 4x) with a per-request
KV cache; requests join while others decode (their prefill in the same step as the others'
decode rows, as vLLM schedules it), finish after their own number of tokens, and at most
``--concurrency`` run at once. Every request is steered at every block's output (``post_block``)
by one of four named vectors. Each contender runs the same schedule of steps on its own copy of
the model (same weights, same token ids), in float32 and in bfloat16:

* ``unhooked``: the model alone;
* ``table``: a plain forward hook adding each row's vector gathered from a prebuilt table (row 0
  zeros, row 1+i named vector i), with the per-step row index built from the batch: what a
  runner writes without shmsteer;
* ``native``, ``device``, ``static``: ``SteeringHooks`` on the native CPU path (the engine's
  kernels on the tensor's memory; bfloat16 widened and narrowed inside the library), the device path on CPU tensors, and static (CUDA-graph) mode
  with ``prepare`` per step;
* ``device_gated``: the device path where every request also carries a ``this_token`` probe
  gate (probe at block 1, adds at blocks 2-3), against ``device``.

Contenders alternate step by step: each round runs the whole schedule once per contender, the
contenders' step i one after another in a new shuffled order at each step (``--interleave
round``: each contender's whole schedule in turn, the order shuffled per round; a stretch of the
machine's noise then lands on one contender's round, and the per-round ratios spread about three
times wider). Each step is timed by the thread's CPU time (torch runs on this one thread; time
descheduled on a shared machine is not counted; ``--wall`` times wall clock, for the admissions
too, which are otherwise timed by the process's CPU time).
Reported per contender: the median decode-step time (steps with no prefill rows) and, against
``unhooked`` (``device`` for ``device_gated``), the ratio of medians and the median of per-round
ratios, and for each steered path the median of its per-round ratios to the table hook; then (``--host-rounds``, 5 by default, after the timed rounds) each steered contender's
own steering code per decode step by thread CPU time (the table hook's forward hooks and index;
the hooks' step entry, sites and exit), on steps whose batch advanced and on steps where a
request left: a figure the machine's noise moves far less than a step's ratio. Admission from Python is timed too (``Owner.admit`` of an inline override of 32 layers x
4096 floats as numpy arrays, of a named reference, and of no steering; ``--admission-only`` times
only those, the same override as JSON float lists, and as the fork's packed field of an OpenAI
body through ``shmsteer.openai.admission_from_request``).

The goals (issue 43) are printed with each figure, met or not: a steered path's bfloat16 step
goal (float32 is reported, with no goal) and the gated step's goal in each dtype, on the
median of per-round ratios (a slow round moves the ratio of medians, printed beside it, not the
median of rounds). Every goal missed is printed as ``goal missed: ...`` with its figures on
stderr; with ``--check`` the bench then exits 1, except for the goals named by ``--known-miss
DTYPE.CONTENDER`` (printed as missed all the same). ``--slack F`` multiplies every goal by F for
that check, and (slack above 1) raises a step goal to the plain table hook's ratio of the same
run when that is higher: CI (.ci/run) runs ``--dtypes bfloat16 --rounds 21 --check --slack
1.15``, which fails on a regression beyond a loaded machine's noise, not on a ratio within 15%
of its goal or of the table hook; a full run (``--rounds 11``, no slack) is what
docs/serving-loop.md quotes. No test times anything.

    PYTHONPATH=python python python/benchmarks/decode_loop.py [--rounds 11] [--json] [--check [--slack 1.10]]
    PYTHONPATH=python python python/benchmarks/decode_loop.py --admission-only [--admissions 15]
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import shmsteer  # noqa: E402
from shmsteer.openai import admission_from_request  # noqa: E402
from shmsteer.torch_hook import SteeringHooks  # noqa: E402

HIDDEN, HEADS, BLOCKS, NAMED = 256, 4, 4, 4
GOALS = {"step": 1.03, "gated": 1.15, "admit_inline_ms": 5.0, "admit_named_ms": 1.0}

# A step: the rows of each running request, in order: (request id, tokens, phase, first position).
Step = List[Tuple[str, int, str, int]]


def schedule(requests: int, concurrency: int, seed: int = 3) -> List[Step]:
    """A continuous-batching schedule: requests join as others finish (their prefill in a step
    with the others' decode rows) and each generates its own number of tokens."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(6, 21, requests)
    gen = rng.integers(6, 25, requests)
    waiting, running, steps = list(range(requests)), {}, []  # running: id -> tokens generated
    while waiting or running:
        step: Step = []
        for r, done in list(running.items()):
            step.append((f"req-{r}", 1, "decode", int(prompt[r]) + done - 1))
            running[r] = done + 1
            if running[r] >= gen[r]:
                del running[r]
        while waiting and len(running) < concurrency:
            r = waiting.pop(0)
            step.append((f"req-{r}", int(prompt[r]), "prefill", 0))
            running[r] = 1
        steps.append(step)
    return steps


class Block(torch.nn.Module):
    """A pre-norm decoder block; attention reads each request's KV cache."""

    def __init__(self, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.ln1, self.ln2 = torch.nn.LayerNorm(HIDDEN), torch.nn.LayerNorm(HIDDEN)
        self.qkv, self.o = torch.nn.Linear(HIDDEN, 3 * HIDDEN), torch.nn.Linear(HIDDEN, HIDDEN)
        self.up, self.down = torch.nn.Linear(HIDDEN, 4 * HIDDEN), torch.nn.Linear(4 * HIDDEN, HIDDEN)
        self.batch: List[Tuple[Dict[str, Any], int, int]] = []  # (cache, start, end), set per step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln1(x)).split(HIDDEN, dim=1)
        out = torch.empty_like(q)
        hd = HIDDEN // HEADS
        for cache, a, b in self.batch:
            n, past = b - a, cache["len"]
            ks, vs = cache["k"][self.layer], cache["v"][self.layer]
            ks[past:past + n], vs[past:past + n] = k[a:b], v[a:b]
            kk = ks[:past + n].view(past + n, HEADS, hd).transpose(0, 1)
            vv = vs[:past + n].view(past + n, HEADS, hd).transpose(0, 1)
            qq = q[a:b].view(n, HEADS, hd).transpose(0, 1)
            mask = torch.ones(n, past + n, dtype=torch.bool).tril(past)
            att = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask)
            out[a:b] = att.transpose(0, 1).reshape(n, HIDDEN)
        x = x + self.o(out)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Decoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(512, HIDDEN)
        self.blocks = torch.nn.ModuleList(Block(i) for i in range(BLOCKS))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        return x


def vectors(seed: int) -> List[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(HIDDEN) * 0.05).astype(np.float32) for _ in range(BLOCKS)]


def setup(owner: shmsteer.Owner, steps: List[Step]) -> Dict[str, int]:
    """Named vectors v0..v3 and a probe; request r (and its gated twin g-r) references v(r % 4)."""
    for i in range(NAMED):
        owner.register_vector(f"v{i}", [("post_block", l, 1.0, d) for l, d in enumerate(vectors(i))])
    owner.register_vector("p", [("post_block", 1, 1.0, vectors(9)[1])], kind="probe")
    ids = sorted({rid for s in steps for rid, *_ in s}, key=lambda r: int(r.split("-")[1]))
    which = {}
    for rid in ids:
        i = int(rid.split("-")[1]) % NAMED
        which[rid] = i
        over = {"decode": {"refs": [{"name": f"v{i}", "strength": 1.0}]},
                "prefill": {"refs": [{"name": f"v{i}", "strength": 1.0}]}}
        owner.admit(rid, override=over, prompt_len=0)
        gate = {"when": {"kind": "probe", "probe": {"kind": "name", "name": "p"}, "threshold": 0.0, "sharpness": 4},
                "scope": "this_token",
                "apply": {"kind": "add", "steer": {"kind": "name", "name": f"v{(i + 1) % NAMED}"}, "strength": 0.5}}
        owner.admit("g" + rid, override=over, steering=[gate])
    return which


class Runner:
    """One contender: a model copy, its KV caches, and the step function the hooks need."""

    def __init__(self, model: Decoder, dtype: torch.dtype, steps: List[Step], hooks: Optional[SteeringHooks] = None,
                 table: Optional[Tuple[List[torch.Tensor], Dict[str, int]]] = None, prefix: str = "") -> None:
        self.model, self.dtype, self.steps, self.hooks, self.prefix = model, dtype, steps, hooks, prefix
        self.idx = torch.zeros(0, dtype=torch.long)
        if table is not None:
            tables, which = table
            for l, b in enumerate(model.blocks):
                b.register_forward_hook(lambda _m, _i, out, t=tables[l]: out.add_(t.index_select(0, self.idx)))
            self.which = which
        self.table = table is not None
        self.host: Optional[HostClock] = None  # set by host_time: times the steering code
        self.out = torch.zeros(0)  # the last step's output (stepper)
        max_len = 64
        self.fresh = lambda: {"len": 0, "k": [torch.zeros(max_len, HIDDEN, dtype=dtype) for _ in range(BLOCKS)],
                              "v": [torch.zeros(max_len, HIDDEN, dtype=dtype) for _ in range(BLOCKS)]}

    def run(self, times: Optional[List[float]] = None, clock: Callable[[], float] = time.thread_time) -> torch.Tensor:
        """The whole schedule once, from empty caches; each decode-only step timed into times
        (instrumented by host_time: its steering code's thread CPU time in µs). Returns the last
        step's output."""
        for dt in self.stepper(clock):
            if times is not None and dt is not None:
                times.append(dt)
        return self.out

    def stepper(self, clock: Callable[[], float] = time.thread_time) -> Iterator[Optional[float]]:
        """The whole schedule from empty caches, a step an iteration: each yields the step's time
        by clock (by the host clock when instrumented) if the step was decode-only, else None;
        the last step's output is left in self.out."""
        caches: Dict[str, Dict[str, Any]] = {}
        gen = torch.Generator().manual_seed(5)
        self.out = torch.zeros(0)
        for step in self.steps:
            batch, spans, rows, idx = [], [], 0, []
            for rid, n, phase, pos in step:
                c = caches.setdefault(rid, self.fresh())
                batch.append((c, rows, rows + n))
                spans.append((self.prefix + rid, rows, rows + n, phase, pos))
                if self.table:
                    idx += [1 + self.which[rid]] * n
                rows += n
            ids = torch.randint(0, 512, (rows,), generator=gen)
            for b in self.model.blocks:
                b.batch = batch
            if self.host is not None:
                self.host.ns = 0
            t0 = clock()
            if self.table:
                self.idx = torch.tensor(idx) if self.host is None else self.host.call(torch.tensor, idx)
            self.out = self.forward(ids, spans)
            dt = clock() - t0
            for c, a, b in batch:
                c["len"] += b - a
            decode = all(p == "decode" for _, _, p, _ in step)
            yield (dt if self.host is None else self.host.ns / 1e3) if decode else None

    def forward(self, ids: torch.Tensor, spans: Sequence[Tuple[str, int, int, str, int]]) -> torch.Tensor:
        with torch.inference_mode():
            if self.hooks is None:
                return self.model(ids)
            if self.hooks.static:
                self.hooks.prepare(spans)
                out = self.model(ids)
                self.hooks.report()
                return out
            with self.hooks.step(spans):
                return self.model(ids)


def contenders(owner: shmsteer.Owner, base: Decoder, dtype: torch.dtype, steps: List[Step],
               which: Dict[str, int]) -> Dict[str, Runner]:
    def model() -> Decoder:
        return copy.deepcopy(base).to(dtype)

    def hooked(prefix: str = "", **kw: Any) -> Runner:
        m = model()
        h = SteeringHooks(owner, **kw)
        for l, b in enumerate(m.blocks):
            h.attach(b, "post_block", l)
        return Runner(m, dtype, steps, hooks=h, prefix=prefix)

    tables = [torch.zeros(NAMED + 1, HIDDEN, dtype=dtype) for _ in range(BLOCKS)]
    for i in range(NAMED):
        for l, d in enumerate(vectors(i)):
            tables[l][1 + i] = torch.from_numpy(d).to(dtype)
    max_rows = max(sum(n for _, n, _, _ in s) for s in steps)
    out = {"unhooked": Runner(model(), dtype, steps), "table": Runner(model(), dtype, steps, table=(tables, which))}
    out["native"] = hooked()  # bfloat16 through the library's float32 scratch
    out["device"] = hooked(force_device_path=True)
    out["static"] = hooked(static=True, max_tokens=max_rows, device="cpu", dtype=dtype, max_clamps=0)
    out["device_gated"] = hooked(prefix="g", force_device_path=True)
    return out


def check(runs: Dict[str, Runner], dtype: torch.dtype) -> None:
    """Every steered contender gives the plain table hook's output (bfloat16 within its rounding:
    the native path adds in float32)."""
    ref = runs["table"].run()
    tol = 0.0 if dtype == torch.float32 else 0.1
    for k in ("native", "device", "static"):
        if k in runs:
            got = runs[k].run()
            torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol if tol else 1e-5, msg=f"{k} differs")
    assert not torch.equal(runs["unhooked"].run(), ref), "steering changed nothing"


class HostClock:
    """The thread CPU time spent in a contender's steering code: every callable wrapped by
    :meth:`wrap` adds its time (the outermost call only: static ``prepare`` may call ``report``)."""

    def __init__(self) -> None:
        self.ns = 0
        self._depth = 0

    def call(self, f: Callable[..., Any], *a: Any) -> Any:
        self._depth += 1
        t = time.thread_time_ns()
        try:
            return f(*a)
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.ns += time.thread_time_ns() - t

    def wrap(self, f: Callable[..., Any]) -> Callable[..., Any]:
        return lambda *a: self.call(f, *a)


def instrument(r: Runner) -> HostClock:
    """Wrap a contender's steering code in a HostClock: the table hook's forward hooks (and its
    index build, in Runner.run); SteeringHooks' step entry and exit (static mode's prepare and
    report) and each site's function. Not the dispatch around them (torch's forward-hook path,
    the sited forward)."""
    h = r.host = HostClock()
    for b in r.model.blocks:
        for hid, fn in list(b._forward_hooks.items()):
            b._forward_hooks[hid] = h.wrap(fn)
        sites = b.__dict__.get("_shmsteer_sites")
        if sites is not None:
            sites[0][:] = [h.wrap(fn) for fn in sites[0]]
    if r.hooks is not None:
        for name in ("_step_begin", "_step_end", "prepare", "report"):
            if hasattr(r.hooks, name):
                setattr(r.hooks, name, h.wrap(getattr(r.hooks, name)))
    return h


def host_time(runs: Dict[str, Runner], steps: List[Step], rounds: int) -> Dict[str, Dict[str, float]]:
    """Each steered contender's steering code per decode step (µs of thread CPU time; after the
    timed rounds, which it would slow): the median over steps whose batch is the last step's
    (``steady``: the same requests, advanced a token) and over steps where a request left
    (``changed``), and the mean over both. The runners stay instrumented."""
    kinds, last = [], None
    for st in steps:
        ids = [rid for rid, *_ in st]
        kinds.append(None if any(p != "decode" for _, _, p, _ in st) else "steady" if ids == last else "changed")
        last = ids
    dec = [k for k in kinds if k is not None]
    clocks = {k: instrument(r) for k, r in runs.items() if k != "unhooked"}
    per: Dict[str, List[float]] = {k: [] for k in clocks}
    order = list(clocks)
    rng = np.random.default_rng(12)
    for _ in range(rounds):
        rng.shuffle(order)
        for k in order:
            runs[k].run(per[k])  # with a host clock: each decode step's host time
    out = {}
    for k, v in per.items():
        by = {c: [t for t, kk in zip(v, dec * rounds) if kk == c] for c in ("steady", "changed")}
        out[k] = {c: statistics.median(x) if x else float("nan") for c, x in by.items()}
        out[k]["mean"] = statistics.mean(v)
    return out


def time_loop(runs: Dict[str, Runner], rounds: int, clock: Callable[[], float], interleave: str = "step") -> Dict[str, Any]:
    """Each contender's median decode-step time in each of ``rounds`` rounds, and the ratios.
    ``interleave="step"``: a round runs the schedule once for every contender, step by step, the
    contenders in a new shuffled order at each step, so a stretch of the machine's noise lands
    on every contender's same steps; ``"round"``: a round runs each contender's whole schedule
    in turn, in a shuffled order."""
    per_round: Dict[str, List[float]] = {k: [] for k in runs}
    order = list(runs)
    rng = np.random.default_rng(11)
    for _ in range(rounds):
        times: Dict[str, List[float]] = {k: [] for k in runs}
        if interleave == "step":
            its = {k: r.stepper(clock) for k, r in runs.items()}
            for _step in runs[order[0]].steps:
                rng.shuffle(order)
                for k in order:
                    dt = next(its[k])
                    if dt is not None:
                        times[k].append(dt)
        else:
            rng.shuffle(order)
            for k in order:
                runs[k].run(times[k], clock)
        for k, t in times.items():
            per_round[k].append(statistics.median(t) * 1e3)
    med = {k: statistics.median(v) for k, v in per_round.items()}
    ratios = {}
    for k in runs:
        if k == "unhooked":
            continue
        base = "device" if k == "device_gated" else "unhooked"
        ratios[k] = {"of_medians": med[k] / med[base],
                     "median_of_rounds": statistics.median(a / b for a, b in zip(per_round[k], per_round[base])),
                     "rounds_min_max": [min(a / b for a, b in zip(per_round[k], per_round[base])),
                                        max(a / b for a, b in zip(per_round[k], per_round[base]))],
                     "against": base}
        if base == "unhooked" and k != "table" and "table" in runs:  # the plain hook's cost, taken out
            ratios[k]["of_table"] = statistics.median(a / b for a, b in zip(per_round[k], per_round["table"]))
    return {"ms_per_decode_step": med, "ratio": ratios}


def time_admission(reps: int, with_json: bool = False, fork: bool = False,
                   clock: Callable[[], float] = time.process_time) -> Dict[str, float]:
    """Owner.admit from Python at the issue's shape, 32 layers x 4096 floats (median ms of reps
    rounds, the kinds alternated within each round): ``inline``, the override's vectors as
    numpy arrays (by address, shmsteer_request_admit_binary); ``named``, a reference to a named
    vector of that shape; ``none``, no steering; with ``with_json``, ``inline_json`` too, the
    same override as JSON float lists (the path before binary admission), timed after the
    others; with ``fork``, ``fork_packed`` too: the same floats as the fork's packed field of an
    OpenAI body (``decode_steering_vectors``, float32, base64), through
    ``shmsteer.openai.admission_from_request`` and ``Owner.admit`` (the vLLM plugin's path).
    Timed by ``clock``: the process's CPU time (every thread's, the Go runtime's too; time
    descheduled on a shared machine is not counted), or wall time with ``--wall``."""
    ns, secret = "bench-admit-" + uuid.uuid4().hex, uuid.uuid4().hex.encode()
    hidden, layers = 4096, 32
    with shmsteer.Owner(ns, secret=secret, hidden=hidden, layers=layers, arena_bytes=1 << 30) as owner:
        rng = np.random.default_rng(2)
        data = [(rng.standard_normal(hidden) * 0.01).astype(np.float32) for _ in range(layers)]
        owner.register_vector("named", [("post_block", l, 1.0, d) for l, d in enumerate(data)])
        kinds: Dict[str, Callable[[], Optional[Dict[str, Any]]]] = {
            "inline": lambda: {"decode": {"vectors": [{"hook": "post_block", "layer": l, "scale": 1.0, "data": d}
                                                      for l, d in enumerate(data)]}},
            "named": lambda: {"decode": {"refs": [{"name": "named", "strength": 1.0}]}},
            "none": lambda: None,
        }
        if fork:
            packed = {"dtype": "float32", "shape": [layers, hidden], "layer_indices": list(range(layers)),
                      "data": base64.b64encode(np.stack(data).astype("<f4").tobytes()).decode()}
            body = {"model": "m", "prompt": "x", "decode_steering_vectors": {"post_block": packed}}
            kinds["fork_packed"] = lambda: admission_from_request(body, model=owner.model)["override"]
        out: Dict[str, List[float]] = {k: [] for k in kinds}

        def timed(kind: str, make: Callable[[], Optional[Dict[str, Any]]], i: int) -> None:
            rid = f"{kind}-{i}"
            t0 = clock()
            over = make()
            owner.admit(rid, override=over) if over is not None else owner.admit(rid)
            out[kind].append((clock() - t0) * 1e3)
            owner.end(rid)

        for i in range(reps):
            for kind, make in kinds.items():
                timed(kind, make, i)
        if with_json:  # after the others: its garbage (~50 MB a call) would slow them down
            out["inline_json"] = []
            lists = lambda: {"decode": {"vectors": [{"hook": "post_block", "layer": l, "scale": 1.0,  # noqa: E731
                                                     "data": d.tolist()} for l, d in enumerate(data)]}}
            for i in range(reps):
                timed("inline_json", lists, i)  # the float lists built in the timed call, from the arrays
        return {k: statistics.median(v) for k, v in out.items()}


def admission_only(reps: int, clock: Callable[[], float]) -> None:
    """--admission-only: the admission times alone, a small table then one JSON line."""
    ms = time_admission(reps, with_json=True, fork=True, clock=clock)
    goals = {"inline": GOALS["admit_inline_ms"], "named": GOALS["admit_named_ms"]}
    print(f"admission from Python, 32 layers x 4096 floats, median of {reps} rounds (ms):")
    for k, v in ms.items():
        goal = f"  goal <= {goals[k]}: {'met' if v <= goals[k] else 'NOT met'}" if k in goals else ""
        print(f"  {k:12s} {v:9.3f}{goal}")
    print(json.dumps({"admit_ms": ms, "rounds": reps, "goals": goals,
                      "json_over_binary": ms["inline_json"] / ms["inline"]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--concurrency", type=int, default=5)
    ap.add_argument("--admissions", type=int, default=7, help="admissions timed per kind")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--wall", action="store_true", help="time steps by wall clock, not the thread's CPU time")
    ap.add_argument("--admission-only", action="store_true",
                    help="time only the admissions (--admissions rounds), JSON float lists included")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="the loop's dtypes, comma-separated")
    ap.add_argument("--host-rounds", type=int, default=5,
                    help="rounds timing each contender's steering code per decode step, after the timed ones (0: none)")
    ap.add_argument("--interleave", choices=("step", "round"), default="step",
                    help="step: each round runs the contenders step by step, in a new order each step; "
                         "round: each contender's whole schedule in turn")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when a goal is missed (each step goal on the median of per-round ratios)")
    ap.add_argument("--slack", type=float, default=1.0,
                    help="with --check, each goal times this factor (CI: 1.10, for a loaded machine's noise)")
    ap.add_argument("--known-miss", action="append", default=[], metavar="DTYPE.CONTENDER",
                    help="a goal known to be missed (e.g. bfloat16.native): still printed as missed, "
                         "but --check does not fail on it")
    args = ap.parse_args()
    if args.admission_only:
        admission_only(args.admissions, time.perf_counter if args.wall else time.process_time)
        return
    clock = time.perf_counter if args.wall else time.thread_time
    torch.set_num_threads(1)
    torch.manual_seed(0)
    steps = schedule(args.requests, args.concurrency)
    base = Decoder().eval()
    report: Dict[str, Any] = {"shape": {"blocks": BLOCKS, "hidden": HIDDEN, "heads": HEADS, "requests": args.requests,
                                        "concurrency": args.concurrency, "steps": len(steps),
                                        "decode_steps": sum(all(p == "decode" for _, _, p, _ in s) for s in steps)},
                              "rounds": args.rounds, "interleave": args.interleave, "clock": "wall" if args.wall else "thread_cpu", "goals": GOALS,
                              "loop": {}}
    ns, secret = "bench-loop-" + uuid.uuid4().hex, uuid.uuid4().hex.encode()
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=BLOCKS) as owner:
        which = setup(owner, steps)
        for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
            runs = contenders(owner, base, dtype, steps, which)
            check(runs, dtype)
            r = report["loop"][str(dtype).split(".")[1]] = time_loop(runs, args.rounds, clock, args.interleave)
            if args.host_rounds > 0:
                r["host_us"] = host_time(runs, steps, args.host_rounds)
    report["admit_ms"] = time_admission(args.admissions, clock=time.perf_counter if args.wall else time.process_time)
    met = report["met"] = {}
    for dt, r in report["loop"].items():
        for k, v in r["ratio"].items():
            goal = goal_of(dt, k)
            met[f"{dt}.{k}"] = v["median_of_rounds"] <= goal if goal is not None else None
    met["admit_inline"] = report["admit_ms"]["inline"] <= GOALS["admit_inline_ms"]
    met["admit_named"] = report["admit_ms"]["named"] <= GOALS["admit_named_ms"]
    report["missed"] = missed(report, args.slack)
    report["slack"] = args.slack
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_report(report)
    bad = failing(report["missed"], args.known_miss)
    if args.check and bad:
        sys.exit(1)


def failing(missed_goals: List[str], known: List[str]) -> List[str]:
    """Print each missed goal on stderr and return those --check fails on: all but the known
    misses (``dtype.contender``, ``admission.kind``), which are marked as such."""
    out = []
    names = [m.split(":")[0].replace(" ", ".") for m in missed_goals]
    for m, name in zip(missed_goals, names):
        print(f"goal missed{' (known, not failing --check)' if name in known else ''}: {m}", file=sys.stderr)
        if name not in known:
            out.append(m)
    for k in known:
        if k not in names:
            print(f"known miss {k} passed this run's check: drop --known-miss {k} once it holds", file=sys.stderr)
    return out


def goal_of(dtype: str, contender: str) -> Optional[float]:
    """The goal of a contender's ratio: the gated step's in every dtype, the steered paths' step
    goal in bfloat16 (the issue's goal; float32 is reported beside it), none for the table hook."""
    if contender == "device_gated":
        return GOALS["gated"]
    if contender == "table" or dtype != "bfloat16":
        return None
    return GOALS["step"]


def missed(report: Dict[str, Any], slack: float) -> List[str]:
    """What --check fails on: each steered path's median of per-round ratios above its goal
    times slack (the ratio of medians is reported beside it; one slow round moves it, not the
    median of rounds), and each admission median above its goal times slack. With slack above 1
    a step's goal is first raised to the plain table hook's own ratio in the same run when that
    is higher: the noise of that run, since the table hook steers as cheaply as a hook can."""
    out = []
    for dt, r in report["loop"].items():
        table = r["ratio"].get("table", {}).get("median_of_rounds", 0.0)
        for k, v in r["ratio"].items():
            goal = goal_of(dt, k)
            if goal is None:
                continue
            bar, why = goal, f"goal {goal}"
            if slack > 1 and k != "device_gated" and table > goal:
                bar, why = table, f"the table hook's {table:.3f} (goal {goal})"
            if v["median_of_rounds"] > bar * slack:
                out.append(f"{dt} {k}: {v['median_of_rounds']:.3f}x {v['against']} (median of rounds; ratio of medians "
                           f"{v['of_medians']:.3f}, rounds {v['rounds_min_max'][0]:.3f}-{v['rounds_min_max'][1]:.3f}) "
                           f"> {why} x slack {slack}")
    a = report["admit_ms"]
    for k, goal in (("inline", GOALS["admit_inline_ms"]), ("named", GOALS["admit_named_ms"])):
        if a[k] > goal * slack:
            out.append(f"admission {k}: {a[k]:.3f} ms > goal {goal} ms x slack {slack}")
    return out


def print_report(report: Dict[str, Any]) -> None:
    met = report["met"]
    sh = report["shape"]
    how = "interleaved step by step" if report["interleave"] == "step" else "shuffled per round"
    print(f"decode loop: {sh['blocks']} blocks, hidden {sh['hidden']}, {sh['requests']} requests, at most "
          f"{sh['concurrency']} at once, {sh['steps']} steps ({sh['decode_steps']} decode-only); "
          f"{report['rounds']} rounds, contenders {how}")
    for dt, r in report["loop"].items():
        print(f"  {dt}:")
        for k, ms in r["ms_per_decode_step"].items():
            line = f"    {k:13s} {ms:7.3f} ms/decode step"
            if k in r["ratio"]:
                v = r["ratio"][k]
                g = goal_of(dt, k)
                goal = "" if g is None else f"  goal (per-round median) <= {g}: " + ("met" if met[f'{dt}.{k}'] else "NOT met")
                line += (f"  {v['of_medians']:.3f}x {v['against']} (per-round median {v['median_of_rounds']:.3f}, "
                         f"{v['rounds_min_max'][0]:.3f}-{v['rounds_min_max'][1]:.3f}"
                         + (f"; {v['of_table']:.3f}x table" if "of_table" in v else "") + f"){goal}")
            print(line)
        host = r.get("host_us")
        if host:
            print("    steering code per decode step, thread CPU µs (median where the batch advanced / where a "
                  "request left; mean):")
            for k, v in host.items():
                print(f"      {k:13s} {v['steady']:6.0f} / {v['changed']:6.0f}  ({v['mean']:.0f})")
    a = report["admit_ms"]
    print(f"  admission from Python (32 x 4096): inline {a['inline']:.2f} ms (goal <= {GOALS['admit_inline_ms']}: "
          f"{'met' if met['admit_inline'] else 'NOT met'}), named {a['named']:.3f} ms (goal <= "
          f"{GOALS['admit_named_ms']}: {'met' if met['admit_named'] else 'NOT met'}), none {a['none']:.3f} ms")


if __name__ == "__main__":
    main()
