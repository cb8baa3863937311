"""The device path on CUDA: every dtype against the float64 reference, clamps against the CPU
path, and static mode captured in a CUDA graph and replayed over changing steps. Skipped, with
the reason, where torch sees no CUDA device."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not importable (apt-get install python3-torch)")

if not torch.cuda.is_available():
    pytest.skip("torch.cuda.is_available() is False: no CUDA device on this machine", allow_module_level=True)

import shmsteer  # noqa: E402
from shmsteer.torch_hook import SteeringHooks  # noqa: E402

from steering_ref import HIDDEN, HOOKS, LAYERS, Chain, Scenario, assert_close_to_reference, attach  # noqa: E402

SPANS = [("a", 0, 3, "decode"), ("b", 3, 5, "decode"), ("c", 5, 9, "prefill"), ("d", 9, 10, "decode")]
ROWS = 10


@pytest.fixture
def owner(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS, hooks=list(HOOKS)) as o:
        yield o


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
def test_cuda_matches_float64(owner, dtype):
    sc = Scenario(owner)
    chain = Chain().cuda()
    hooks = SteeringHooks(owner, device="cuda")
    attach(hooks, chain)
    x = torch.randn(ROWS, HIDDEN).to(dtype)
    y = x.cuda()
    with torch.no_grad(), hooks.step(SPANS):
        chain(y)
    assert_close_to_reference(y, sc.reference(x, SPANS), dtype, f"cuda {dtype}", roundings_per_site=2)


def test_cuda_clamps_equal_cpu(owner):
    Scenario(owner, seed=3)
    x = torch.randn(ROWS, HIDDEN) * 2
    cpu, dev = SteeringHooks(owner), SteeringHooks(owner, device="cuda")
    cc, cd = Chain(), Chain().cuda()
    attach(cpu, cc)
    attach(dev, cd)
    a, b = x.clone(), x.cuda()
    with torch.no_grad():
        with cpu.step(SPANS):
            cc(a)
        with dev.step(SPANS):
            cd(b)
    torch.testing.assert_close(b.cpu(), a, rtol=0, atol=1e-5)


def test_cuda_graph_replay_equals_eager(owner):
    sc = Scenario(owner, seed=5)
    rng = np.random.default_rng(2)
    chain = Chain().cuda()
    static = SteeringHooks(owner, static=True, max_tokens=16, device="cuda", dtype=torch.bfloat16)
    attach(static, chain)
    inp = torch.zeros(16, HIDDEN, dtype=torch.bfloat16, device="cuda")
    static.prepare(SPANS)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(2):  # warm-up outside the graph
            chain(inp.clone())
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    buf = torch.zeros_like(inp)
    with torch.cuda.graph(g), torch.no_grad():
        out = chain(buf)
    ids = ["a", "b", "c", "d"]
    for step in range(6):
        if step == 2:
            sc.register("n1", [("post_block", l, 1.0, rng.standard_normal(HIDDEN).astype(np.float32)) for l in range(LAYERS)])
        if step == 4:
            sc.end("a")
        spans, r = [], 0
        for i in rng.permutation(len(ids))[:3]:
            n = int(rng.integers(1, 5))
            spans.append((ids[i], r, r + n, "decode" if rng.random() < 0.5 else "prefill"))
            r += n
        x = torch.randn(16, HIDDEN).to(torch.bfloat16)
        static.prepare(spans)
        buf.copy_(x.cuda())
        g.replay()
        torch.cuda.synchronize()
        assert_close_to_reference(out, sc.reference(x, spans), torch.bfloat16, f"replay step {step}")
