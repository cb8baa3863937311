"""The device path, its static (CUDA-graph) mode and the native CPU path, every dtype, against a
float64 reference of the composed steering; one engine crossing per step; bad input refused."""

from __future__ import annotations

import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not importable (apt-get install python3-torch)")

import shmsteer  # noqa: E402
from shmsteer import _lib  # noqa: E402
from shmsteer.device import FAST_STEP_REASON, UnsupportedDtypeError  # noqa: E402
from shmsteer.errors import BadBatchError, BatchCapacityError, ShapeError  # noqa: E402
from shmsteer.torch_hook import SteeringHooks  # noqa: E402

from steering_ref import HIDDEN, HOOKS, LAYERS, Chain, Scenario, assert_close_to_reference, attach  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SPANS = [("a", 0, 3, "decode"), ("b", 3, 5, "decode"), ("c", 5, 9, "prefill"), ("d", 9, 10, "decode"),
         ("never-admitted", 10, 11, "prefill"), ("b", 11, 12, "prefill")]
ROWS = 12


@pytest.fixture
def owner(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS, hooks=list(HOOKS) + ["mlp_out"]) as o:
        yield o


def make_hooks(o, path, dtype, **kw):
    if path == "native":
        return SteeringHooks(o, **kw)
    if path == "device":
        return SteeringHooks(o, force_device_path=True, **kw)
    return SteeringHooks(o, static=True, max_tokens=16, device="cpu", dtype=dtype, **kw)


def run(hooks, chain, x, spans, rows=None):
    y = x.clone()
    with torch.no_grad():
        if hooks.static:
            hooks.prepare(spans)
            chain(y)
        else:
            with hooks.step(spans, rows=rows):
                chain(y)
    return y


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("path", ["native", "device", "static"])
def test_every_path_and_dtype_matches_float64(owner, path, dtype):
    sc = Scenario(owner)
    chain = Chain()
    hooks = make_hooks(owner, path, dtype)
    attach(hooks, chain)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(ROWS, HIDDEN, generator=g).to(dtype)
    if path == "static":
        x = torch.cat([x, torch.randn(16 - ROWS, HIDDEN, generator=g).to(dtype)])  # padded rows: slot 0
    want = sc.reference(x, SPANS)
    assert not np.allclose(want, x.double().numpy()), "the steering must change something"
    got = run(hooks, chain, x, SPANS)
    assert got.dtype == dtype
    assert_close_to_reference(got, want, dtype, f"{path} {dtype}", roundings_per_site=1 if path == "native" else 2)
    if path == "static":
        assert torch.equal(got[ROWS:], x[ROWS:]), "rows outside every span are untouched"
    hooks.close()


def test_clamps_device_equal_cpu(owner):
    sc = Scenario(owner, seed=3)
    chain = Chain()
    x = torch.randn(ROWS, HIDDEN) * 2
    outs = {}
    for path in ("native", "device", "static"):
        hooks = make_hooks(owner, path, torch.float32)
        attach(hooks, chain)
        xi = torch.cat([x, torch.zeros(4, HIDDEN)]) if path == "static" else x
        outs[path] = run(hooks, chain, xi, SPANS)[:ROWS]
        hooks.close()
    torch.testing.assert_close(outs["device"], outs["native"], rtol=0, atol=1e-5)
    torch.testing.assert_close(outs["static"], outs["native"], rtol=0, atol=1e-5)
    want = sc.reference(x, SPANS)
    assert_close_to_reference(outs["native"], want, torch.float32, "native")


def test_clamps_change_the_result(owner):
    """The clamp test above is not vacuous: the scenario's clamps move rows of a, b and c."""
    sc = Scenario(owner, seed=3)
    x = torch.randn(ROWS, HIDDEN) * 2
    with_clamps = sc.reference(x, SPANS)
    for s in (sc.global_, *sc.reqs.values()):
        for t in s.values():
            t.pop("clamps", None)
    assert not np.allclose(with_clamps, sc.reference(x, SPANS), atol=1e-3)


def test_static_equals_eager_over_changing_steps(owner):
    sc = Scenario(owner, seed=5)
    rng = np.random.default_rng(9)
    chain_e, chain_s, chain_n = Chain(), Chain(), Chain()
    eager = SteeringHooks(owner, force_device_path=True, max_slots=8)
    static = SteeringHooks(owner, static=True, max_tokens=16, device="cpu", dtype=torch.float32, max_slots=8)
    native = SteeringHooks(owner)
    attach(eager, chain_e)
    attach(static, chain_s)
    attach(native, chain_n)
    ids = ["a", "b", "c", "d", "never-admitted"]
    for step in range(10):
        if step == 3:  # a re-registration recomposes every set that references it
            sc.register("n1", [("post_block", l, 1.0, rng.standard_normal(HIDDEN).astype(np.float32)) for l in range(LAYERS)])
        if step == 5:
            sc.end("a")  # ended: the global slot
        if step == 6:
            sc.admit("e", {"base": {"vectors": [sc.vec("pre_attn", 1, 2.0)]}})
            ids.append("e")
        if step == 7:
            sc.set_global({"base": {"vectors": [sc.vec("pre_attn", 3, 1.0)]}})
        order = rng.permutation(len(ids))
        spans, r = [], 0
        for i in order[: 2 + rng.integers(len(ids) - 1)]:
            n = int(rng.integers(1, 4))
            if r + n > 16:
                break
            spans.append((ids[i], r, r + n, "decode" if rng.random() < 0.5 else "prefill"))
            r += n
        x = torch.randn(16, HIDDEN)
        got_s = run(static, chain_s, x, spans)
        got_e = run(eager, chain_e, x, spans, rows=16)
        got_n = run(native, chain_n, x, spans, rows=16)
        torch.testing.assert_close(got_s, got_e, rtol=0, atol=1e-6, msg=f"step {step}")
        torch.testing.assert_close(got_e, got_n, rtol=0, atol=1e-5, msg=f"step {step}")
        assert_close_to_reference(got_s, sc.reference(x, spans), torch.float32, f"step {step}")
        assert static.batch_checksum == eager.batch_checksum != 0
    assert static.uploads == eager.uploads > 0


class _CountedResolver:
    """A _faststep.Resolver whose engine calls are counted as the ctypes ones are."""

    def __init__(self, inner, calls):
        self.inner, self.calls = inner, calls

    def resolve(self, *a):
        self.calls.append("shmsteer_batch_resolve")
        return self.inner.resolve(*a)

    def begin(self, *a):
        self.calls.append("shmsteer_batch_resolve")
        return self.inner.begin(*a)


@pytest.mark.parametrize("resolver", ["extension", "ctypes"])
def test_one_engine_crossing_per_step_none_at_sites(owner, monkeypatch, resolver):
    Scenario(owner)
    chain = Chain()
    hooks = SteeringHooks(owner, force_device_path=True)
    attach(hooks, chain)
    x = torch.randn(ROWS, HIDDEN)
    run(hooks, chain, x, SPANS)  # warm: tables made, rows uploaded
    gc.collect()  # other tests' batches freed now, not by a collection inside the counted steps
    calls = []
    for name in dir(_lib.lib):
        if name.startswith("shmsteer_"):
            fn = getattr(_lib.lib, name)

            def counted(*a, _fn=fn, _name=name):
                calls.append(_name)
                return _fn(*a)
            monkeypatch.setattr(_lib.lib, name, counted)
    fast = hooks.batch._fast
    if resolver == "extension" and fast is None:
        pytest.skip(f"the _faststep extension is not in use: {FAST_STEP_REASON}")
    monkeypatch.setattr(hooks.batch, "_fast", None if fast is None or resolver == "ctypes" else _CountedResolver(fast, calls))
    y = x.clone()
    for _ in range(3):
        with torch.no_grad(), hooks.step(SPANS):
            before = len(calls)
            chain(y)
            assert len(calls) == before, f"a hooked site called the engine: {calls[before:]}"
    assert calls == ["shmsteer_batch_resolve"] * 3, calls  # one call per step, ending it


@pytest.mark.parametrize("resolver", ["extension", "ctypes"])
def test_native_path_calls_the_kernels_only(owner, monkeypatch, resolver):
    Scenario(owner)
    chain = Chain()
    hooks = SteeringHooks(owner)
    attach(hooks, chain)
    x = torch.randn(ROWS, HIDDEN)
    run(hooks, chain, x, SPANS)  # warm
    gc.collect()  # other tests' batches freed now, not by a collection inside the counted step
    calls = []
    for name in dir(_lib.lib):
        if name.startswith("shmsteer_"):
            fn = getattr(_lib.lib, name)

            def counted(*a, _fn=fn, _name=name):
                calls.append(_name)
                return _fn(*a)
            monkeypatch.setattr(_lib.lib, name, counted)
    fast, apply, end = hooks.batch._fast, hooks._fast_apply, hooks.stepper._fast_end
    if resolver == "extension" and (fast is None or apply is None or end is None):
        pytest.skip(f"the _faststep extension is not in use: {FAST_STEP_REASON}")
    if resolver == "ctypes":
        monkeypatch.setattr(hooks.batch, "_fast", None)
        monkeypatch.setattr(hooks, "_fast_apply", None)
        monkeypatch.setattr(hooks.stepper, "_fast_end", None)
    else:
        def counted_apply(*a):
            calls.append("shmsteer_stepper_apply_bf16" if a[-1] else "shmsteer_stepper_apply")
            return apply(*a)

        def counted_end(*a):
            calls.append("shmsteer_stepper_end")
            return end(*a)
        monkeypatch.setattr(hooks.batch, "_fast", _CountedResolver(fast, calls))
        monkeypatch.setattr(hooks, "_fast_apply", counted_apply)
        monkeypatch.setattr(hooks.stepper, "_fast_end", counted_end)
    run(hooks, chain, x, SPANS)
    sites = LAYERS * len(HOOKS)
    # The step's resolve begins it (and gives its batch checksum); the sites call the kernels.
    assert calls == ["shmsteer_batch_resolve"] + ["shmsteer_stepper_apply"] * sites + ["shmsteer_stepper_end"], calls
    assert hooks.checksum != 0


@pytest.mark.parametrize("path", ["native", "device", "static"])
def test_bad_input_typed_and_changes_nothing(owner, path):
    sc = Scenario(owner)
    chain = Chain()
    hooks = make_hooks(owner, path, torch.float32)
    attach(hooks, chain)
    rows = 16 if path == "static" else ROWS
    x = torch.randn(rows, HIDDEN)
    mod = chain.points[1]

    def hooked(t, spans=SPANS):
        with torch.no_grad():
            if hooks.static:
                hooks.prepare(spans)
                mod(t)
            else:
                with hooks.step(spans):
                    mod(t)

    cases = [
        (torch.randn(rows, HIDDEN + 1), ShapeError),
        (torch.randn(HIDDEN, rows).t(), ShapeError),  # non-contiguous
        (torch.randint(-5, 5, (rows, HIDDEN), dtype=torch.int8), UnsupportedDtypeError),
        (torch.randn(rows, HIDDEN, dtype=torch.float64), UnsupportedDtypeError),
    ]
    if path != "static":
        cases.append((torch.randn(ROWS - 2, HIDDEN), ShapeError))  # spans past its rows
    for t, err in cases:
        before = t.clone()
        with pytest.raises(err):
            hooked(t)
        assert torch.equal(t, before), f"{err.__name__} changed the tensor"
    if path == "static":
        with pytest.raises(BadBatchError):
            hooks.prepare([("a", 0, 17, "decode")])  # past max_tokens
    with pytest.raises(BadBatchError):
        hooked(x.clone(), [("a", 3, 1, "decode")])
    # Still steering as before.
    got = run(hooks, chain, x, SPANS)
    assert_close_to_reference(got, sc.reference(x, SPANS), torch.float32, "after bad input")


def test_batch_capacity_is_typed(owner):
    Scenario(owner)
    hooks = SteeringHooks(owner, force_device_path=True, max_slots=2)
    chain = Chain()
    attach(hooks, chain)
    with pytest.raises(BatchCapacityError):
        run(hooks, chain, torch.randn(ROWS, HIDDEN), SPANS)
    no_clamps = SteeringHooks(owner, force_device_path=True, max_clamps=0)
    attach(no_clamps, Chain())
    with pytest.raises(BatchCapacityError):
        with no_clamps.step(SPANS):
            pass


def test_checksums(owner):
    Scenario(owner)
    a, b = SteeringHooks(owner, force_device_path=True), SteeringHooks(owner)
    ca, cb = Chain(), Chain()
    attach(a, ca)
    attach(b, cb)
    x = torch.randn(ROWS, HIDDEN)
    run(a, ca, x, SPANS)
    run(b, cb, x, SPANS)
    assert a.batch_checksum == b.batch_checksum != 0  # the same resolution, whatever the path
    assert b.checksum != 0 and a.checksum == 0  # the CPU checksum covers CPU applies only


def test_tables_grow_with_the_slots(owner):
    """More distinct steering sets than the tables' first capacity (16 rows): the eager tables
    grow, keeping the rows already uploaded."""
    sc = Scenario(owner, clamps=False)
    chain_d, chain_n = Chain(), Chain()
    dev, nat = SteeringHooks(owner, force_device_path=True), SteeringHooks(owner)
    attach(dev, chain_d)
    attach(nat, chain_n)
    spans = []
    for i in range(40):
        sc.admit(f"g{i}", {"base": {"vectors": [sc.vec("post_block", i % LAYERS, 0.5)]}})
        spans.append((f"g{i}", i, i + 1, "decode"))
    for n in (10, 25, 40):  # the batch grows step by step
        x = torch.randn(40, HIDDEN)
        got = run(dev, chain_d, x, spans[:n], rows=40)
        want = run(nat, chain_n, x, spans[:n], rows=40)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        assert_close_to_reference(got, sc.reference(x, spans[:n]), torch.float32, f"{n} requests")
    assert dev._tables is not None and dev._tables.capacity >= 41


def test_the_mode_is_chosen_at_construction(owner):
    """SteeringHooks(...) builds one class per mode, from its arguments alone; native hooks
    refuse a tensor off the CPU before changing anything, naming the device path's argument."""
    from shmsteer.torch_hook import DeviceHooks, DeviceMismatchError, NativeHooks, StaticHooks
    Scenario(owner)
    kinds = [(SteeringHooks(owner), NativeHooks, "native"), (SteeringHooks(owner, device="cpu"), NativeHooks, "native"),
             (SteeringHooks(owner, force_device_path=True), DeviceHooks, "device"),
             (SteeringHooks(owner, device="meta"), DeviceHooks, "device"),
             (SteeringHooks(owner, static=True, max_tokens=4, device="cpu", dtype=torch.float32), StaticHooks, "static")]
    for h, cls, mode in kinds:
        assert type(h) is cls and isinstance(h, SteeringHooks) and h.mode == mode
        assert h.force_device_path == (mode != "native")
    native = kinds[0][0]
    chain = Chain()
    attach(native, chain)
    x = torch.empty(ROWS, HIDDEN, device="meta")
    with pytest.raises(DeviceMismatchError, match="device="), torch.no_grad(), native.step(SPANS):
        chain(x)
    assert isinstance(DeviceMismatchError("x"), UnsupportedDtypeError)
    meta = kinds[3][0]  # device hooks built for another device than the tensors'
    chain2 = Chain()
    attach(meta, chain2)
    y = torch.randn(ROWS, HIDDEN)
    before = y.clone()
    with pytest.raises(DeviceMismatchError, match="meta"), torch.no_grad(), meta.step(SPANS):
        chain2(y)
    assert torch.equal(y, before)


def test_ranks_in_other_processes_resolve_the_same(owner, ns, secret, spawn):
    """Worker processes (spawned, attached as clients) steering the same batch at the same pinned
    version get the same batch checksum and the same floats, whatever slots their history gave
    them; a write after the pin changes nothing for them."""
    import device_workers
    Scenario(owner)
    pin = owner.snapshot()  # the scheduler keeps the version it hands out pinned
    version = pin.version
    owner.admit("a", {"base": {"vectors": [{"hook": "post_block", "layer": 0, "scale": 9.0, "data": [1.0] * HIDDEN}]}})
    q = spawn.Queue()
    procs = [spawn.Process(target=device_workers.device_step, args=(ns, secret, version, SPANS, warm, q))
             for warm in (False, True)]
    for p in procs:
        p.start()
    got = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert got[0][0] == got[1][0] != 0
    assert got[0][1] == got[1][1]
    # This process at the same version agrees; at the current one (after the write) it does not.
    hooks = SteeringHooks(owner, force_device_path=True)
    chain = Chain()
    attach(hooks, chain)
    y = torch.randn(12, HIDDEN, generator=torch.Generator().manual_seed(5))
    y2 = y.clone()
    with torch.no_grad():
        with hooks.step(SPANS, version=version):
            chain(y)
        assert hooks.batch_checksum == got[0][0]
        assert y.numpy().tobytes() == got[0][1]
        with hooks.step(SPANS):
            chain(y2)
        assert hooks.batch_checksum != got[0][0]
    pin.close()
