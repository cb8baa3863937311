"""Declarative gates on CUDA: the eager device path and the static mode captured in a CUDA graph
and replayed over steps whose probes fire differently, against the native CPU path (the same
decisions, outputs within rounding), f32/bf16/f16. Skipped, with the reason, where torch sees no
CUDA device."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch not importable (apt-get install python3-torch)")

if not torch.cuda.is_available():
    pytest.skip("torch.cuda.is_available() is False: no CUDA device on this machine", allow_module_level=True)

from shmsteer.torch_hook import SteeringHooks  # noqa: E402

from test_device_gates import ADD, ALWAYS, PROBE, Chain, _atten, _input, _own_steering, _run, owner  # noqa: E402,F401

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
STEERING = [{"when": PROBE, "scope": "this_token", "apply": ADD},
            {"when": PROBE, "scope": "next_step", "apply": _atten(0.5)},
            {"when": ALWAYS, "scope": "rest_of_request", "apply": ADD}]
STEPS = [[0.9, 0.1], [0.1, 0.1], [0.9, 0.9], [0.1, 0.9], [0.1, 0.1]]
TOL = {torch.float32: 1e-5, torch.bfloat16: 0.1, torch.float16: 0.02}


def _attached(h: SteeringHooks, chain: Chain) -> None:
    for layer, m in enumerate(chain.points):
        h.attach(m, "post_block", layer)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16", "f16"])
def test_cuda_eager_gates_equal_native(owner, dtype):  # noqa: F811
    owner.admit("r", override=_own_steering(), steering=STEERING)
    nat, dev = SteeringHooks(owner), SteeringHooks(owner, device="cuda")
    cn, cd = Chain(), Chain().cuda()
    _attached(nat, cn)
    _attached(dev, cd)
    for i, h0 in enumerate(STEPS):
        x = _input(h0, dtype)
        want = _run(nat, cn, x, [("r", 0, 2, "decode")])
        y = x.cuda()
        with torch.no_grad(), dev.step([("r", 0, 2, "decode")]):
            cd(y)
        torch.testing.assert_close(y.cpu().float(), want.float(), rtol=0, atol=TOL[dtype], msg=f"step {i}")
        assert dev.stepper.stats()["gate_checksum"] == nat.stepper.stats()["gate_checksum"], f"step {i}"
    assert dev.stepper.stats()["gate_scopes"] == nat.stepper.stats()["gate_scopes"]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16", "f16"])
def test_cuda_graph_replays_the_gates(owner, dtype):  # noqa: F811
    """Static mode in a captured CUDA graph: prepare() writes the gate columns into the
    persistent per-token buffers, the replay reads them; the scores go back after the replay."""
    owner.admit("r", override=_own_steering(), steering=STEERING)
    nat, cn = SteeringHooks(owner), Chain()
    _attached(nat, cn)
    static = SteeringHooks(owner, static=True, max_tokens=2, device="cuda", dtype=dtype, max_row_gates=2)
    chain = Chain().cuda()
    _attached(static, chain)
    spans = [("warm-up", 0, 2, "decode")]  # a request nobody admitted: nothing steered
    static.prepare(spans)
    buf = torch.zeros(2, 8, dtype=dtype, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(2):
            chain(buf.clone())
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        out = chain(buf)
    static.report()
    for i, h0 in enumerate(STEPS):
        x = _input(h0, dtype)
        want = _run(nat, cn, x, [("r", 0, 2, "decode")])
        static.prepare([("r", 0, 2, "decode")])
        buf.copy_(x.cuda())
        g.replay()
        static.report()
        torch.testing.assert_close(out.cpu().float(), want.float(), rtol=0, atol=TOL[dtype], msg=f"replay step {i}")
        assert static.stepper.stats()["gate_checksum"] == nat.stepper.stats()["gate_checksum"], f"replay step {i}"
