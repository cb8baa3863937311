"""Both resolve paths of shmsteer.device.StepBatch: the extension's (shmsteer._faststep, which
calls shmsteer_batch_resolve and compares the answer with the last one in C) and the ctypes one.
They must give the same answers, reuse the same Resolved objects, and raise the same exceptions
with the same messages."""

from __future__ import annotations

import ctypes

import os
import subprocess
import sys
import sysconfig
from typing import Any, List, Tuple

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not importable (apt-get install python3-torch)")

import shmsteer  # noqa: E402
from shmsteer import _lib  # noqa: E402
from shmsteer import device as D  # noqa: E402
from shmsteer.torch_hook import SteeringHooks  # noqa: E402

from steering_ref import HIDDEN, HOOKS, LAYERS, Chain, Scenario, attach  # noqa: E402

PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(shmsteer.__file__)))


def _need_fast() -> None:
    if D.FAST_STEP:
        return
    headers = os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    if headers and not os.environ.get(_lib.STEP_CTYPES_ENV):
        pytest.fail(f"Python.h is installed but the resolve extension is not in use: {D.FAST_STEP_REASON}")
    pytest.skip(f"the resolve extension is not in use: {D.FAST_STEP_REASON}")


@pytest.fixture
def owner(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS, hooks=list(HOOKS) + ["mlp_out"]) as o:
        yield o


def _hooks(owner: Any, fast: bool) -> SteeringHooks:
    hooks = SteeringHooks(owner, force_device_path=True)
    attach(hooks, Chain())
    if not fast:
        hooks.batch._fast = None
    elif hooks.batch._fast is None:
        _need_fast()
    return hooks


def test_batches_use_the_extension_when_built(owner):
    _need_fast()
    hooks = _hooks(owner, True)
    assert isinstance(hooks.batch._fast, shmsteer._faststep.Resolver)


def test_env_forces_the_ctypes_resolve():
    code = ("import shmsteer.device as D\n"
            "print(D.FAST_STEP, D.FAST_STEP_REASON)\n")
    env = dict(os.environ, PYTHONPATH=PKG_DIR, **{_lib.STEP_CTYPES_ENV: "1"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"False ${_lib.STEP_CTYPES_ENV} is set\n"


def test_resolver_refuses_bad_arguments():
    _need_fast()
    ext = shmsteer._faststep
    with pytest.raises(ValueError, match="NULL"):
        ext.Resolver(0, 1)
    with pytest.raises(TypeError):
        ext.Resolver(1, 2, info=3)
    r = ext.Resolver(1, 2)  # never called with these addresses
    with pytest.raises(TypeError, match="resolve"):
        r.resolve(0, 0, 0)
    with pytest.raises(OverflowError):
        r.resolve(-1, 0, 0, 0, 0)
    with pytest.raises(TypeError, match="begin"):
        r.begin(0, 0)
    with pytest.raises(TypeError, match="report"):
        r.report(0)
    with pytest.raises(TypeError, match="apply"):
        ext.apply(1, 0, 0, 0, 0, 0, 0)
    with pytest.raises(OverflowError):
        ext.apply(1, 1 << 33, 0, 0, 0, 0, 0, False)
    with pytest.raises(OverflowError):
        ext.apply(1, 0, -(1 << 40), 0, 0, 0, 0, False)
    with pytest.raises(TypeError, match="end"):
        ext.end()
    with pytest.raises(OverflowError):
        ext.end(-1)
    with pytest.raises(ValueError, match="NULL"):
        ext.bind(0, 0, 0, 0, 0)
    with pytest.raises(TypeError):
        ext.bind(1, 1, 1, 1)


def _outcome(fn: Any) -> Tuple[str, Any]:
    try:
        return "value", fn()
    except Exception as e:  # the type and the message are part of the answer
        return type(e).__name__, str(e)


def test_bad_reports_refused_alike(owner):
    """A report no step awaits raises the same exception with the same message through the
    extension and through ctypes, for float32 scores (the tensor's memory) and float64 ones
    (the numpy copy either way); the reports counted stay equal."""
    Scenario(owner, clamps=False)
    fast, slow = _hooks(owner, True), _hooks(owner, False)
    got = [_outcome(lambda: h.batch.report_tensor(torch.zeros(2, 1))) for h in (fast, slow)]
    assert got[0] == got[1] and got[0][0] == "NoStepError", got
    got = [_outcome(lambda: h.batch.report_tensor(torch.zeros(2, 1, dtype=torch.float64))) for h in (fast, slow)]
    assert got[0] == got[1] and got[0][0] == "NoStepError", got
    assert fast.batch.reports == slow.batch.reports


def _content(res: D.Resolved) -> Tuple[Any, ...]:
    return (res.checksum, res.index.tolist(), res.slots, res.sites.tolist(), res.site_clamps.tolist(),
            res.updates.tolist(), np.asarray(res.stage).tolist(), res.gates.cols)


def test_both_paths_answer_alike(owner):
    """The same steps on two device-path hooks of one owner, one resolving through the
    extension and one through ctypes: the same answers, the same Resolved reuse (a new one
    exactly when the answer's buffers or counts changed), the same errors (after which the
    next answer is compared with the last success's)."""
    sc = Scenario(owner, clamps=False)
    fast, slow = _hooks(owner, True), _hooks(owner, False)
    steps: List[Tuple[List[Any], int]] = [
        ([("a", 0, 1, "decode", 5), ("b", 1, 2, "decode", 3)], 2),
        ([("a", 0, 1, "decode", 5), ("b", 1, 2, "decode", 3)], 2),
        ([("a", 0, 1, "decode", 6), ("b", 1, 2, "decode", 4)], 2),
        ([("a", 0, 1, "decode", 7), ("b", 1, 3, "decode", 5)], 2),  # rows past the block: an error
        ([("a", 0, 1, "decode", 7), ("b", 1, 2, "decode", 5)], 2),  # the answer before the error again
        ([("b", 0, 1, "decode", 6)], 1),
        ([("b", 0, 1, "decode", 7), ("a", 1, 3, "prefill", 0)], 3),
        ([("b", 0, 1, "decode", 8), ("a", 1, 2, "decode", 2)], 2),
        ([("b", 0, 1, "decode", 9), ("a", 1, 2, "decode", 3)], 2),
        ([("b", 0, 1, "decode", 10), ("a", 1, 2, "decode", 4)], 2),
        ([("b", 0, 1, "decode", 11), ("a", 1, 2, "decode", 5)], 2),
    ]
    last = {id(fast): None, id(slow): None}
    for i, (spans, rows) in enumerate(steps):
        if i == 8:
            sc.register("n1", [("post_block", 1, 2.0, np.full(HIDDEN, 0.5, np.float32))])
        got = []
        for h in (fast, slow):
            packed = h._packer.pack(spans)
            kind, res = _outcome(lambda: h.batch.resolve(packed, rows, end=True))
            if kind != "value":
                got.append((kind, res, None))
                continue
            reused = res is last[id(h)]
            last[id(h)] = res
            got.append((kind, _content(res), reused))
        assert got[0] == got[1], f"step {i}: extension {got[0]}, ctypes {got[1]}"
        if i == 3:
            assert got[0][0] == "BadBatchError", got[0]
        if i in (2, 10):
            assert got[0][2] is True, f"step {i}: the same buffers and counts reuse the last Resolved"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_native_steps_alike(owner, dtype):
    """The native path through the extension (its resolve, its applies and its end) and through
    ctypes: the same rows, batch checksums and step checksums over steps that advance, change
    and repeat; the same error code for an apply outside a step, the same answer to an end."""
    _need_fast()
    sc = Scenario(owner, clamps=True)
    fast, slow = SteeringHooks(owner), SteeringHooks(owner)
    chain_f, chain_s = Chain(), Chain()
    attach(fast, chain_f)
    attach(slow, chain_s)
    slow._fast_apply = slow.stepper._fast_end = None
    slow.batch._fast = None
    assert fast.batch._fast is not None and fast._fast_apply is not None and fast.stepper._fast_end is not None
    x = torch.randn(4, HIDDEN).to(dtype)
    steps = [[("a", 0, 1, "decode", 5), ("b", 1, 3, "prefill", 0)],
             [("a", 0, 1, "decode", 6), ("b", 1, 2, "decode", 2)],
             [("a", 0, 1, "decode", 7), ("b", 1, 2, "decode", 3)],
             [("b", 0, 1, "decode", 4)],
             [("b", 0, 1, "decode", 5), ("a", 1, 4, "prefill", 0)]]
    for i, spans in enumerate(steps):
        if i == 3:
            sc.register("n0", [("post_block", l, 2.0, np.full(HIDDEN, 0.25, np.float32)) for l in range(LAYERS)])
        out = []
        for h, chain in ((fast, chain_f), (slow, chain_s)):
            y = x.clone()
            with torch.no_grad(), h.step(spans):
                chain(y)
            out.append((y, h.batch_checksum, h.checksum))
        assert not torch.equal(out[0][0], x), f"step {i}: steered"
        assert torch.equal(out[0][0], out[1][0]), f"step {i}"
        assert out[0][1:] == out[1][1:], f"step {i}"
    # Outside a step the library refuses an apply, through either path, with the same code.
    y = x.clone()
    p = fast._packer.pack(steps[0])
    bf16 = dtype is torch.bfloat16
    got = D.FAST_APPLY(fast.stepper.handle, 0, 0, y.data_ptr(), y.numel(), p.addr, p.n, bf16)
    fn = _lib.lib.shmsteer_stepper_apply_bf16 if bf16 else _lib.lib.shmsteer_stepper_apply
    want = fn(fast.stepper.handle, 0, 0, y.data_ptr(), y.numel(), p.ptr, p.n)
    assert got == want != 0 and torch.equal(y, x)
    # An end outside a step returns the last step's checksum, through either path.
    sum_out = ctypes.c_uint64()
    rc = _lib.lib.shmsteer_stepper_end(slow.stepper.handle, ctypes.byref(sum_out))
    assert D.FAST_END(fast.stepper.handle) == (0, fast.checksum) and (rc, sum_out.value) == (0, slow.checksum)


@pytest.fixture
def gates_owner(ns, secret):
    import test_device_gates as G
    with shmsteer.Owner(ns, secret=secret, hidden=G.D, layers=G.LAYERS) as o:
        o.register_vector("p", [("post_block", 1, 1.0, G._unit(0))], kind="probe")
        o.register_vector("s", [("post_block", l, 1.0, G._unit(1)) for l in range(G.LAYERS)])
        yield o


def test_gate_reports_alike(gates_owner):
    """Every gate case of test_device_gates on two device-path hooks, one reporting its scores
    through the extension (the tensor's memory as it is) and one through ctypes (a numpy copy):
    the same outputs, gate checksums and counts at every step, both equal to the native path."""
    import test_device_gates as G
    if not D.FAST_STEP:
        _need_fast()
    for c, (name, gates, steps) in enumerate(G.CASES):
        rid = f"r{c}"
        gates_owner.admit(rid, override=G._own_steering(), steering=gates, conversation=f"c{c}")
        nat, cn = G._hooks(gates_owner, "native", torch.float32, 2)
        fast, cf = G._hooks(gates_owner, "device", torch.float32, 2)
        slow, cs = G._hooks(gates_owner, "device", torch.float32, 2)
        slow.batch._fast = None
        assert fast.batch._fast is not None
        for i, (h0, phase) in enumerate(steps):
            x = G._input(h0, torch.float32)
            spans = [(rid, 0, len(h0), phase)]
            want = G._run(nat, cn, x, spans)
            got_fast, got_slow = G._run(fast, cf, x, spans), G._run(slow, cs, x, spans)
            assert torch.equal(got_fast, got_slow), f"{name} step {i}"
            torch.testing.assert_close(got_fast, want, rtol=0, atol=1e-5, msg=f"{name} step {i}")
            assert fast.gate_checksum == slow.gate_checksum, f"{name} step {i}"
            sf, ss, sn = fast.stepper.stats(), slow.stepper.stats(), nat.stepper.stats()
            assert sf == ss and sf["gate_checksum"] == sn["gate_checksum"], f"{name} step {i}"
        assert fast.batch.reports == slow.batch.reports
        for h in (nat, fast, slow):
            h.close()
        gates_owner.end(rid)
