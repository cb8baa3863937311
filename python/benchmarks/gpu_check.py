"""The GPU check (issue 39, item 7): one command, one report of what shmsteer's torch paths do on
this machine's device.

On a machine with an NVIDIA GPU, its own torch (2.11 or later) and transformers, and nothing
installable, it needs only the built ``libshmsteer.so`` (``go generate ./capi`` puts it in
``python/shmsteer/``; elsewhere set ``$SHMSTEER_LIB``) and the checkout's ``python/``::

    PYTHONPATH=python python python/benchmarks/gpu_check.py --out report.md

It runs in under 8 minutes and writes a markdown report to ``--out`` and the same results as
JSON next to it (``report.json``), and prints the report. Sections:

(a) the CUDA tests: pytest on the test files with CUDA variants, the tests whose names (or
    files) say ``cuda`` (``-k cuda``), in a subprocess: pass/fail/skip counts, skip reasons;
(b) the device path per decode step against the best plain torch gather-add (``index_add_``, a
    gather into a preallocated buffer then ``add_``, advanced indexing), ms per step, float32 and
    bfloat16, after checking all of them add the same rows;
(c) static mode captured in a CUDA graph and replayed over changing steps against a plain torch
    reference (on a CPU: "not run: needs CUDA");
(d) a small model with the hooks attached, ``torch._dynamo.explain``'s graph breaks, and the
    ``torch.compile``'d model against eager over changing steps (device path and static mode;
    once the package registers its ``shmsteer::`` operators, static mode, the compile mode, is
    compiled with ``fullgraph=True`` and a graph break there fails); then issue 39's figure, a
    compiled small Llama in bf16 decoding a batch of 8 steered on every request against the same
    compiled model unsteered (``hf_compile.py``: ms per step, the ratio, its goal of 1.05x met
    or not; with --quick a 1-layer hidden-64 model, a few rounds, not judged);
(e) the Hugging Face generate check: ``shmsteer.hf`` steering greedy ``generate()`` of a small
    random Llama against a plain torch hook adding the same vectors, unsteered rows against an
    unsteered run ("not available" when ``shmsteer.hf`` or ``transformers`` does not import).

Without a CUDA device everything runs on CPU tensors (``--quick``, as CI runs it, uses smaller
shapes, fewer rounds and the ``aot_eager`` compile backend on a CPU). The exit status is 1 only
when a check failed (a result differed from its reference, a CUDA test failed, or a section
raised); skipped and not-run sections say why. Timings are reported, not judged: the ratio goal
of issue 39 (device path <= 1.10x the best gather-add) is marked met or not.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
sys.path.insert(0, PYDIR)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import shmsteer  # noqa: E402
from shmsteer.torch_hook import SteeringHooks  # noqa: E402

PASS, FAIL, SKIPPED, NOT_RUN, NOT_AVAILABLE = "pass", "fail", "skipped", "not run", "not available"
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
#: issue 39's goal for the device path against the fastest plain gather-add.
DEVICE_GOAL = 1.10


class CheckFailure(Exception):
    """A result differed from its reference (the report's section says which)."""


@dataclass
class Config:
    device: torch.device
    quick: bool
    backend: str
    test_timeout: float
    budget: float
    started: float = field(default_factory=time.monotonic)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


@dataclass
class Section:
    key: str
    title: str
    status: str = PASS
    lines: List[str] = field(default_factory=list)
    data: Dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


# ---- shared fixtures -------------------------------------------------------------------------


class Chain(torch.nn.Module):
    """Identity modules, one per layer: the hooked outputs are what the steering made of the input."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Identity() for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


class Scenario:
    """An in-process owner with ``named`` vectors at post_block of every layer, a global base, and
    ``requests`` admitted, request ``r`` referencing vector ``r % named``; the composed tables
    (row 0 zeros, row 1+i global + vector i) are what every contender adds."""

    def __init__(self, owner: shmsteer.Owner, layers: int, hidden: int, named: int, requests: int, seed: int = 1):
        self.owner, self.layers, self.hidden, self.named = owner, layers, hidden, named
        self.rng = np.random.default_rng(seed)
        self.vectors = np.zeros((named, layers, hidden), np.float32)
        for i in range(named):
            self.register(i)
        g = (self.rng.standard_normal((layers, hidden)) * 0.01).astype(np.float32)
        owner.set_global({"base": {"vectors": [{"hook": "post_block", "layer": l, "scale": 1.0, "data": g[l].tolist()}
                                               for l in range(layers)]}})
        self.global_ = g
        for r in range(requests):
            owner.admit(f"req-{r}", override={"base": {"refs": [{"name": f"v{r % named}", "strength": 1.0}]}})

    def register(self, i: int) -> None:
        self.vectors[i] = (self.rng.standard_normal((self.layers, self.hidden)) * 0.01).astype(np.float32)
        self.owner.register_vector(f"v{i}", [("post_block", l, 1.0, self.vectors[i][l]) for l in range(self.layers)])

    def tables(self, device: torch.device, dtype: torch.dtype) -> List[torch.Tensor]:
        out = []
        for l in range(self.layers):
            t = np.zeros((self.named + 1, self.hidden), np.float32)
            t[1:] = self.global_[l][None, :] + self.vectors[:, l, :]
            out.append(torch.from_numpy(t).to(device=device, dtype=dtype))
        return out

    @staticmethod
    def slot(request: int, named: int) -> int:
        return 1 + request % named


def owner_for(hidden: int, layers: int, arena_mib: int = 64) -> shmsteer.Owner:
    return shmsteer.Owner("gpu-check-" + uuid.uuid4().hex, secret=uuid.uuid4().hex.encode(), hidden=hidden,
                          layers=layers, arena_bytes=arena_mib << 20)


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    try:
        torch.testing.assert_close(got.float().cpu(), want.float().cpu(), rtol=1e-5 if got.dtype == torch.float32 else 1.6e-2,
                                   atol=1e-6 if got.dtype == torch.float32 else 1e-5)
    except AssertionError as e:
        raise CheckFailure(f"{what}: {str(e).splitlines()[0]}") from None


def reference(x: torch.Tensor, tables: Sequence[torch.Tensor], idx: torch.Tensor) -> torch.Tensor:
    """x with each layer's composed rows added in turn, in x's dtype (as each layer rounds)."""
    out = x.clone()
    for t in tables:
        out = out + t[idx]
    return out


# ---- (a) the CUDA tests ----------------------------------------------------------------------


def cuda_test_files() -> List[str]:
    tests = os.path.join(PYDIR, "tests")
    out = []
    for name in sorted(os.listdir(tests)):
        if name.startswith("test_") and name.endswith(".py"):
            with open(os.path.join(tests, name)) as f:
                if "cuda" in f.read():
                    out.append(os.path.join("tests", name))
    return out


def junit_counts(path: str) -> Tuple[Dict[str, int], List[str], List[str]]:
    """(counts, failed test ids, distinct skip reasons) of a pytest --junitxml file."""
    root = ET.parse(path).getroot()
    counts = {"tests": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failed, reasons = [], []
    for case in root.iter("testcase"):
        counts["tests"] += 1
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed" if case.find("failure") is not None else "errors"] += 1
            failed.append(name)
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
            msg = (case.find("skipped").get("message") or "").strip()  # type: ignore[union-attr]
            if msg and msg not in reasons:
                reasons.append(msg)
        else:
            counts["passed"] += 1
    return counts, failed, reasons


def section_cuda_tests(cfg: Config, sec: Section) -> None:
    try:
        import pytest  # noqa: F401
    except ImportError as e:
        sec.status = SKIPPED
        sec.lines.append(f"skipped: pytest is not importable here ({e})")
        return
    files = cuda_test_files()
    sec.data["files"] = files
    with tempfile.TemporaryDirectory() as d:
        xml = os.path.join(d, "junit.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-k", "cuda", "--junitxml", xml, *files]
        env = dict(os.environ, PYTHONPATH=PYDIR + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONDONTWRITEBYTECODE="1")
        try:
            r = subprocess.run(cmd, cwd=PYDIR, env=env, capture_output=True, text=True, timeout=cfg.test_timeout)
        except subprocess.TimeoutExpired:
            raise CheckFailure(f"pytest ran past {cfg.test_timeout:.0f} s") from None
        if not os.path.exists(xml):
            raise CheckFailure(f"pytest exited {r.returncode} with no report:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        counts, failed, reasons = junit_counts(xml)
    sec.data.update(counts=counts, failed=failed, skip_reasons=reasons, returncode=r.returncode)
    sec.lines.append(f"`pytest -k cuda` on {', '.join(f'`{f}`' for f in files)}")
    sec.lines.append(f"{counts['tests']} tests: {counts['passed']} passed, {counts['failed']} failed, "
                     f"{counts['errors']} errors, {counts['skipped']} skipped")
    sec.lines += [f"skip reason: {m}" for m in reasons]
    sec.lines += [f"FAILED {n}" for n in failed]
    if counts["failed"] or counts["errors"] or r.returncode not in (0,) or counts["tests"] == 0:
        tail = "\n".join(r.stdout.splitlines()[-30:])
        sec.lines.append(f"pytest exit status {r.returncode}; its output's end:\n```\n{tail}\n```")
        sec.status = FAIL
    elif counts["passed"] == 0:
        sec.status = SKIPPED


# ---- (b) the device path against plain gather-adds -------------------------------------------


def gather_adds(chain: Chain, tables: List[torch.Tensor], idx: torch.Tensor, kind: str) -> None:
    """Attach the plain torch contender ``kind`` to every block: each row gathers its composed row."""
    rows = torch.arange(idx.numel(), device=idx.device)
    for l, b in enumerate(chain.blocks):
        t = tables[l]
        if kind == "index_add_":
            def fn(_m: Any, _i: Any, out: torch.Tensor, t: torch.Tensor = t) -> None:
                out.index_add_(0, rows, t.index_select(0, idx))
        elif kind == "gather+add_":
            buf = torch.empty(idx.numel(), t.shape[1], device=t.device, dtype=t.dtype)

            def fn(_m: Any, _i: Any, out: torch.Tensor, t: torch.Tensor = t, buf: torch.Tensor = buf) -> None:
                torch.index_select(t, 0, idx, out=buf)
                out.add_(buf)
        else:  # advanced indexing
            def fn(_m: Any, _i: Any, out: torch.Tensor, t: torch.Tensor = t) -> None:
                out.add_(t[idx])
        b.register_forward_hook(fn)


def time_contenders(cfg: Config, contenders: Dict[str, Callable[[torch.Tensor], None]], x: torch.Tensor,
                    rounds: int, steps: int) -> Dict[str, float]:
    """Median ms per step of each contender, interleaved round by round in a shuffled order."""
    times: Dict[str, List[float]] = {k: [] for k in contenders}
    order = list(contenders)
    rng = np.random.default_rng(7)
    for _ in range(rounds):
        rng.shuffle(order)
        for k in order:
            cfg.sync()
            t0 = time.perf_counter()
            for _ in range(steps):
                contenders[k](x)
            cfg.sync()
            times[k].append((time.perf_counter() - t0) * 1e3 / steps)
    return {k: statistics.median(v) for k, v in times.items()}


def device_step_dtype(cfg: Config, dtype: torch.dtype, shape: Dict[str, int], rounds: int, steps: int) -> Dict[str, Any]:
    layers, hidden, rows, named = shape["layers"], shape["hidden"], shape["rows"], shape["named"]
    with owner_for(hidden, layers, 512 if not cfg.quick else 64) as owner:
        sc = Scenario(owner, layers, hidden, named, rows)
        tables = sc.tables(cfg.device, dtype)
        idx = torch.tensor([Scenario.slot(r, named) for r in range(rows)], device=cfg.device)
        spans = [(f"req-{r}", r, r + 1, "decode") for r in range(rows)]
        contenders: Dict[str, Callable[[torch.Tensor], None]] = {}
        for kind in ("index_add_", "gather+add_", "advanced indexing"):
            chain = Chain(layers)
            gather_adds(chain, tables, idx, kind)
            contenders[kind] = lambda x, chain=chain: chain(x)
        hooks = SteeringHooks(owner, force_device_path=True)
        chain = Chain(layers)
        for l, b in enumerate(chain.blocks):
            hooks.attach(b, "post_block", l)

        def shmsteer_step(x: torch.Tensor) -> None:
            with hooks.step(spans):
                chain(x)
        contenders["shmsteer device path"] = shmsteer_step
        with torch.no_grad():
            x0 = torch.randn(rows, hidden, device=cfg.device).to(dtype)
            want = reference(x0, tables, idx)
            for k, fn in contenders.items():
                x = x0.clone()
                fn(x)
                assert_close(x, want, f"{k} ({dtype})")
            med = time_contenders(cfg, contenders, torch.zeros(rows, hidden, device=cfg.device, dtype=dtype), rounds, steps)
        hooks.close()
    best = min((k for k in med if k != "shmsteer device path"), key=lambda k: med[k])
    return {"ms_per_step": med, "best_baseline": best, "ratio": med["shmsteer device path"] / med[best]}


def section_device_step(cfg: Config, sec: Section) -> None:
    shape = ({"layers": 8, "hidden": 1024, "rows": 32, "named": 8} if cfg.quick else
             {"layers": 32, "hidden": 4096, "rows": 64, "named": 16})
    rounds, steps = (5, 5) if cfg.quick else (15, 20)
    sec.data["shape"] = shape
    sec.lines.append(f"{shape['layers']} layers x post_block, hidden {shape['hidden']}, {shape['rows']} decode rows "
                     f"(one request each) over {shape['named']} named vectors + a global base; {rounds} rounds x "
                     f"{steps} steps, interleaved, median wall ms per step on {cfg.device}; every contender's output "
                     "checked against x + the composed rows first")
    sec.lines.append("")
    sec.lines.append("| dtype | index_add_ | gather+add_ | advanced indexing | shmsteer device path | ratio to best | goal <= "
                     f"{DEVICE_GOAL:.2f}x |")
    sec.lines.append("|---|---|---|---|---|---|---|")
    if not cfg.cuda:
        torch.set_num_threads(1)  # CPU tensors: one thread, as device_step.py (less noise on a shared machine)
    for name, dtype in DTYPES.items():
        r = device_step_dtype(cfg, dtype, shape, rounds, steps)
        sec.data[name] = r
        m = r["ms_per_step"]
        sec.lines.append(f"| {name} | {m['index_add_']:.3f} | {m['gather+add_']:.3f} | {m['advanced indexing']:.3f} | "
                         f"{m['shmsteer device path']:.3f} | {r['ratio']:.2f}x ({r['best_baseline']}) | "
                         f"{'met' if r['ratio'] <= DEVICE_GOAL else 'not met'} |")
    if not cfg.cuda:
        sec.lines.append("")
        sec.lines.append("CPU tensors: the device path's host work, with the gather-add on the CPU; the goal is judged "
                         "on a GPU run (timings on a shared CPU are noisy, and not failed).")


# ---- (c) static mode in a CUDA graph ---------------------------------------------------------


def static_graph_dtype(cfg: Config, dtype: torch.dtype, graph: bool = True) -> Dict[str, Any]:
    """Static hooks captured in a CUDA graph, replayed over changing steps against the reference
    (``graph=False``: the same steps run eagerly, for trying the check without a device)."""
    layers, hidden, max_tokens, named, requests = 4, 256, 32, 4, 12
    rng = np.random.default_rng(3)
    with owner_for(hidden, layers) as owner:
        sc = Scenario(owner, layers, hidden, named, requests, seed=5)
        hooks = SteeringHooks(owner, static=True, max_tokens=max_tokens, device=cfg.device, dtype=dtype, max_clamps=0)
        chain = Chain(layers)
        for l, b in enumerate(chain.blocks):
            hooks.attach(b, "post_block", l)
        buf = torch.zeros(max_tokens, hidden, device=cfg.device, dtype=dtype)
        hooks.prepare([("req-0", 0, 1, "decode")])
        replay = capture_graph(chain, buf) if graph else torch.no_grad()(lambda: chain(buf))
        times = []
        steps = 8
        for step in range(steps):
            if step == 3:
                sc.register(1)  # a vector changes mid-run: the tables follow
            n = int(rng.integers(1, max_tokens + 1))
            ids = rng.integers(0, requests, size=n)
            spans = [(f"req-{int(r)}", i, i + 1, "decode" if step else "prefill") for i, r in enumerate(ids)]
            x = torch.randn(max_tokens, hidden, device=cfg.device).to(dtype)
            tables = sc.tables(cfg.device, dtype)
            idx = torch.zeros(max_tokens, dtype=torch.long, device=cfg.device)
            idx[:n] = torch.tensor([Scenario.slot(int(r), named) for r in ids], device=cfg.device)
            want = reference(x, tables, idx)
            cfg.sync()
            t0 = time.perf_counter()
            buf.copy_(x)
            hooks.prepare(spans)
            replay()
            cfg.sync()
            times.append((time.perf_counter() - t0) * 1e3)
            assert_close(buf, want, f"graph replay step {step} ({dtype}, {n} rows)")
        hooks.close()
    return {"steps": steps, "max_tokens": max_tokens, "ms_per_step_median": statistics.median(times[1:])}


def capture_graph(chain: Chain, buf: torch.Tensor) -> Callable[[], None]:
    """chain(buf) captured in a CUDA graph (after a warm-up on a side stream, as torch's docs ask)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(2):
            chain(buf.clone())
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        chain(buf)
    return graph.replay


def section_static_graph(cfg: Config, sec: Section) -> None:
    if not cfg.cuda:
        sec.status = NOT_RUN
        sec.lines.append("not run: needs CUDA (static mode's forward on CPU tensors is covered by the device-path "
                         "tests; a CUDA graph needs a CUDA device)")
        return
    sec.lines.append("4 layers, hidden 256, max_tokens 32: captured once, replayed over 8 steps of 1..32 rows from 12 "
                     "requests (a vector re-registered at step 3), each replay against x + the composed rows")
    for name, dtype in DTYPES.items():
        r = static_graph_dtype(cfg, dtype)
        sec.data[name] = r
        sec.lines.append(f"{name}: {r['steps']} replays equal the reference; prepare + replay "
                         f"{r['ms_per_step_median']:.3f} ms per step (median)")


# ---- (d) torch.compile --------------------------------------------------------------------------


class Tiny(torch.nn.Module):
    """A small residual MLP stack: block i's output is post_block of layer i."""

    def __init__(self, layers: int, hidden: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(hidden) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


class Block(torch.nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


def shmsteer_ops() -> List[str]:
    """The torch operators the package registered (``shmsteer::...``)."""
    try:
        importlib.import_module("shmsteer.ops")  # where the package registers them, once it does
    except ModuleNotFoundError as e:
        if e.name != "shmsteer.ops":
            raise
    try:
        names = torch._C._dispatch_get_all_op_names()
    except AttributeError:
        return []
    return sorted(n for n in names if n.startswith("shmsteer::"))


def explain_breaks(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> Tuple[int, int, List[str]]:
    torch._dynamo.reset()
    ex = torch._dynamo.explain(fn)(x)
    reasons: List[str] = []
    for r in ex.break_reasons:
        line = str(getattr(r, "reason", r)).splitlines()[0][:200]
        if line not in reasons:
            reasons.append(line)
    return ex.graph_count, ex.graph_break_count, reasons


def compile_mode(cfg: Config, mode: str, strict: bool) -> Tuple[Dict[str, Any], List[str]]:
    """Explain and compile Tiny with the hooks in ``mode`` ("device path" or "static"); each of 3
    steps (different spans) must give the eager result, and a steered result unlike the plain model's."""
    layers, hidden, named, requests, rows = (2 if cfg.quick else 4), 64, 3, 6, 8
    torch.manual_seed(0)
    model = Tiny(layers, hidden).to(cfg.device).eval()
    lines: List[str] = []
    with owner_for(hidden, layers) as owner:
        Scenario(owner, layers, hidden, named, requests, seed=11)
        static = mode == "static"
        hooks = (SteeringHooks(owner, static=True, max_tokens=rows, device=cfg.device, dtype=torch.float32, max_clamps=0)
                 if static else SteeringHooks(owner, force_device_path=True))
        for l, b in enumerate(model.blocks):
            hooks.attach(b, "post_block", l)
        steps = [[(f"req-{(s + r) % requests}", r, r + 1, "decode") for r in range(rows)] for s in range(3)]

        @torch.no_grad()
        def run(fn: Callable[[torch.Tensor], torch.Tensor], spans: Sequence[Any], x: torch.Tensor) -> torch.Tensor:
            if static:
                hooks.prepare(spans)
                return fn(x)
            with hooks.step(spans):
                return fn(x)

        x = torch.randn(rows, hidden, device=cfg.device)
        graphs, breaks, reasons = explain_step(hooks, static, steps[0], model, x)
        lines.append(f"{mode}: `torch._dynamo.explain`: {graphs} graph(s), {breaks} graph break(s)")
        lines += [f"  break: {r}" for r in reasons[:5]]
        if strict and breaks:
            raise CheckFailure(f"{mode}: {breaks} graph break(s) with the shmsteer:: operators registered: {reasons[:3]}")
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=cfg.backend, fullgraph=strict)
        for s, spans in enumerate(steps):
            want = run(model, spans, x.clone())
            got = run(compiled, spans, x.clone())
            assert_close(got, want, f"{mode}: compiled step {s} against eager")
        hooks.remove()
        with torch.no_grad():
            plain = model(x.clone())
        if torch.equal(plain, want):
            raise CheckFailure(f"{mode}: the steered output equals the plain model's: nothing was steered")
        hooks.close()
    lines.append(f"{mode}: compiled ({cfg.backend}{', fullgraph' if strict else ''}) equals eager over 3 steps of "
                 f"different spans; steering changed the output")
    return {"graphs": graphs, "graph_breaks": breaks, "break_reasons": reasons}, lines


def explain_step(hooks: SteeringHooks, static: bool, spans: Sequence[Any], model: torch.nn.Module,
                 x: torch.Tensor) -> Tuple[int, int, List[str]]:
    with torch.no_grad():
        if static:
            hooks.prepare(spans)
            return explain_breaks(model, x.clone())
        with hooks.step(spans):
            return explain_breaks(model, x.clone())


def section_compile(cfg: Config, sec: Section) -> None:
    ops = shmsteer_ops()
    strict = bool(ops)
    sec.data["shmsteer_ops"] = ops
    sec.lines.append(f"{2 if cfg.quick else 4} residual MLP blocks, hidden 64, 8 decode rows, float32 on {cfg.device}, "
                     "hooks at post_block; "
                     f"backend {cfg.backend}")
    if strict:
        sec.lines.append(f"torch operators registered: {', '.join(ops)}: in static mode (the torch.compile mode: "
                         "persistent buffers prepare() fills) a graph break is a failure (fullgraph=True); the eager "
                         "device path's breaks (its per-step shapes) are reported")
    else:
        sec.lines.append("no shmsteer:: torch operator is registered: graph breaks are reported, not failed "
                         "(issue 39 item 2's goal is none)")
    for mode in ("device path", "static"):
        r, lines = compile_mode(cfg, mode, strict and mode == "static")
        sec.data[mode] = r
        sec.lines += lines
    compiled_llama(cfg, sec)


def compiled_llama(cfg: Config, sec: Section) -> None:
    """Issue 39's figure: a compiled small Llama in bf16 decoding a batch of 8, every request
    steered, against the same compiled model unsteered (``hf_compile.py``; with --quick a
    smaller model and few rounds, the figure then only shows the path runs)."""
    try:
        import transformers  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means the figure cannot be made here
        sec.lines.append(f"compiled Llama figure: not available (`import transformers` failed: {type(e).__name__}: {e})")
        return
    import hf_compile  # this script's directory is on sys.path
    size = dict(hidden=64, layers=1, rounds=3, steps=4) if cfg.quick else dict(hidden=256, layers=4, rounds=9, steps=32)
    res = hf_compile.measure(cfg.device, size["rounds"], size["steps"], backend=cfg.backend, hidden=size["hidden"],
                             layers=size["layers"])
    torch._dynamo.reset()
    sec.data["compiled_llama"] = res
    sec.lines += hf_compile.lines(res)
    if not res["check"]["compiled_steers"]:
        raise CheckFailure("compiled Llama: the compiled steered model's logits are not the eager steered model's")
    r = res["ratio"]
    verdict = "not judged (--quick: a smaller model)" if cfg.quick else ("met" if r <= hf_compile.GOAL else "not met")
    sec.lines.append(f"compiled Llama goal (steered <= {hf_compile.GOAL}x unsteered, wall-time medians): {r:.4f}x, {verdict}")


# ---- (e) Hugging Face generate -------------------------------------------------------------------


def tiny_llama(device: torch.device, dtype: torch.dtype) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()


@contextlib.contextmanager
def plain_steering(model: Any, rows: Sequence[int], vectors: np.ndarray) -> Iterator[None]:
    """The hand-written reference: each decoder layer's output gets ``vectors[layer]`` added at
    the real (unpadded) tokens of batch rows ``rows``, in every forward."""
    mask: Dict[str, torch.Tensor] = {}
    layers = model.model.layers

    def pre(_m: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        am = kwargs.get("attention_mask")
        s = ids.shape[1]
        mask["m"] = (am[:, -s:] if am is not None else torch.ones_like(ids)).bool()

    def post(layer: int) -> Callable[..., None]:
        def fn(_m: Any, _i: Any, out: Any) -> None:
            h = out[0] if isinstance(out, tuple) else out
            v = torch.from_numpy(vectors[layer]).to(device=h.device, dtype=h.dtype)
            for r in rows:
                h[r][mask["m"][r]] += v
        return fn
    handles = [model.register_forward_pre_hook(pre, with_kwargs=True)]
    handles += [l.register_forward_hook(post(i)) for i, l in enumerate(layers)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def hf_dtype(cfg: Config, hf: Any, dtype: torch.dtype) -> List[str]:
    model = tiny_llama(cfg.device, dtype)
    layers, hidden = model.config.num_hidden_layers, model.config.hidden_size
    rng = np.random.default_rng(4)
    vectors = (rng.standard_normal((layers, hidden)) * 2.0).astype(np.float32)
    ids = torch.tensor([[0, 0, 5, 17, 33, 8, 9], [1, 40, 41, 42, 43, 44, 45], [0, 0, 0, 7, 70, 71, 72]], device=cfg.device)
    am = (ids != 0).long()
    gen = dict(input_ids=ids, attention_mask=am, max_new_tokens=8, do_sample=False, pad_token_id=0)
    with owner_for(hidden, layers) as owner:
        owner.register_vector("v", [("post_block", l, 1.0, vectors[l]) for l in range(layers)])
        owner.admit("r0", override={"base": {"refs": [{"name": "v", "strength": 1.0}]}})
        owner.admit("r2", override={"base": {"refs": [{"name": "v", "strength": 1.0}]}})
        with torch.no_grad():
            plain = model.generate(**gen)
            with plain_steering(model, [0, 2], vectors):
                want = model.generate(**gen)
        steer = hf.HFSteering(model, owner, points=["post_block"])
        try:
            got = steer.generate(["r0", None, "r2"], **gen)
        finally:
            steer.close()
        with torch.no_grad():
            after = model.generate(**gen)
    name = {torch.float32: "f32", torch.bfloat16: "bf16"}[dtype]
    if not torch.equal(got, want):
        raise CheckFailure(f"{name}: shmsteer.hf's tokens differ from the plain hook's:\n{got.tolist()}\n{want.tolist()}")
    if not torch.equal(got[1], plain[1]):
        raise CheckFailure(f"{name}: the unsteered row differs from an unsteered run")
    if torch.equal(want[0], plain[0]) or torch.equal(want[2], plain[2]):
        raise CheckFailure(f"{name}: the steered rows equal the unsteered run's: the check cannot tell")
    if not torch.equal(after, plain):
        raise CheckFailure(f"{name}: generate after HFSteering.close() differs from the unsteered run")
    return [f"{name}: 3 left-padded rows (two steered, one not), 8 greedy tokens: equal to the plain hook's; "
            "the unsteered row equal to an unsteered run; after close() the model is unsteered"]


def section_hf(cfg: Config, sec: Section) -> None:
    try:
        import shmsteer.hf as hf
    except Exception as e:  # noqa: BLE001 - any import failure means the module is not usable here
        sec.status = NOT_AVAILABLE
        sec.lines.append(f"not available: `import shmsteer.hf` failed ({type(e).__name__}: {e})")
        return
    try:
        import transformers
    except Exception as e:  # noqa: BLE001
        sec.status = NOT_AVAILABLE
        sec.lines.append(f"not available: `import transformers` failed ({type(e).__name__}: {e})")
        return
    sec.data["transformers"] = transformers.__version__
    sec.lines.append(f"transformers {transformers.__version__}; a random 2-layer Llama (hidden 64) on {cfg.device}, "
                     "steered at post_block of every layer")
    for dtype in DTYPES.values():
        sec.lines += hf_dtype(cfg, hf, dtype)


# ---- the report ------------------------------------------------------------------------------

SECTIONS: List[Tuple[str, str, Callable[[Config, Section], None]]] = [
    ("cuda_tests", "(a) CUDA tests", section_cuda_tests),
    ("device_step", "(b) device path per decode step against plain torch gather-adds", section_device_step),
    ("static_graph", "(c) static mode in a CUDA graph", section_static_graph),
    ("compile", "(d) torch.compile with the hooks", section_compile),
    ("hf", "(e) Hugging Face generate", section_hf),
]


def run_section(cfg: Config, key: str, title: str, fn: Callable[[Config, Section], None]) -> Section:
    sec = Section(key, title)
    left = cfg.budget - (time.monotonic() - cfg.started)
    if left <= 0:
        sec.status = SKIPPED
        sec.lines.append(f"skipped: the run's time budget ({cfg.budget:.0f} s) is spent")
        return sec
    t0 = time.monotonic()
    try:
        fn(cfg, sec)
    except CheckFailure as e:
        sec.status = FAIL
        sec.lines.append(f"FAILED: {e}")
    except Exception as e:  # noqa: BLE001 - a section that raises is a failure the report shows
        sec.status = FAIL
        sec.lines.append(f"FAILED: {type(e).__name__}: {e}")
        sec.lines.append("```\n" + "".join(traceback.format_exc().splitlines(True)[-15:]) + "```")
    sec.seconds = time.monotonic() - t0
    return sec


def environment(cfg: Config) -> Dict[str, Any]:
    env: Dict[str, Any] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           "host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
                           "shmsteer": shmsteer.__version__, "library": shmsteer._lib.lib._name,
                           "device": str(cfg.device), "quick": cfg.quick, "compile_backend": cfg.backend}
    if cfg.cuda:
        env["gpu"] = torch.cuda.get_device_name(cfg.device)
        env["cuda"] = torch.version.cuda
    else:
        env["gpu"] = "none (torch.cuda.is_available() is False)" if not torch.cuda.is_available() else "not used (--device cpu)"
    return env


def markdown(env: Dict[str, Any], sections: Sequence[Section], seconds: float) -> str:
    out = ["# shmsteer GPU check", ""]
    out += [f"- {k}: {v}" for k, v in env.items()]
    out += [f"- runtime: {seconds:.1f} s", "", "| section | status | seconds |", "|---|---|---|"]
    out += [f"| {s.title} | {s.status} | {s.seconds:.1f} |" for s in sections]
    for s in sections:
        out += ["", f"## {s.title}: {s.status}", ""] + s.lines
    failed = [s.title for s in sections if s.status == FAIL]
    out += ["", f"**Result: {'FAIL (' + '; '.join(failed) + ')' if failed else 'no check failed'}**", ""]
    return "\n".join(out)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="gpu_check_report.md",
                    help="the markdown report; the JSON goes beside it (same name, .json)")
    ap.add_argument("--quick", action="store_true", help="small shapes and few rounds (CI on a CPU)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--backend", default="", help="torch.compile backend (default: inductor; aot_eager with --quick on a CPU)")
    ap.add_argument("--sections", default=",".join(k for k, _, _ in SECTIONS), help="comma-separated subset to run")
    ap.add_argument("--test-timeout", type=float, default=180.0, help="seconds the CUDA tests may take")
    ap.add_argument("--budget", type=float, default=450.0, help="seconds after which remaining sections are skipped")
    return ap.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    dev = "cuda" if args.device == "auto" and torch.cuda.is_available() else ("cpu" if args.device == "auto" else args.device)
    if dev == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda, but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    backend = args.backend or ("aot_eager" if args.quick and dev == "cpu" else "inductor")
    cfg = Config(torch.device(dev), args.quick, backend, args.test_timeout, args.budget)
    wanted = args.sections.split(",")
    unknown = set(wanted) - {k for k, _, _ in SECTIONS}
    if unknown:
        print(f"gpu_check: unknown sections {sorted(unknown)}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    sections = [run_section(cfg, k, t, fn) for k, t, fn in SECTIONS if k in wanted]
    seconds = time.monotonic() - t0
    env = environment(cfg)
    report = markdown(env, sections, seconds)
    stem, ext = os.path.splitext(args.out)
    md_path = stem + ".md" if ext == ".json" else args.out  # --out report.json: the markdown beside it
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(md_path, "w") as f:
        f.write(report)
    with open(stem + ".json", "w") as f:
        json.dump({"environment": env, "seconds": seconds, "sections": [asdict(s) for s in sections]}, f, indent=1, default=str)
    print(report)
    return 1 if any(s.status == FAIL for s in sections) else 0


if __name__ == "__main__":
    sys.exit(main())
