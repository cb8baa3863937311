"""Declarative gates on the device path (eager and static) against the native path: every scope
and apply, the same decisions (the stepper's gate checksum and counts), outputs within rounding,
f32/bf16/f16; the static mode's gate work allocates nothing per step."""

from __future__ import annotations

import base64
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not importable (apt-get install python3-torch)")

import shmsteer  # noqa: E402
from shmsteer.errors import BatchCapacityError  # noqa: E402
from shmsteer.torch_hook import SteeringHooks  # noqa: E402

D, LAYERS = 8, 3
PROBE = {"kind": "probe", "probe": {"kind": "name", "name": "p"}, "threshold": 0.5, "sharpness": 100}
ALWAYS = {"kind": "always"}
ADD = {"kind": "add", "steer": {"kind": "name", "name": "s"}, "strength": 2}


def _atten(f: float) -> Dict[str, Any]:
    return {"kind": "attenuate", "strength": f}


def _unit(i: int) -> np.ndarray:
    v = np.zeros(D, np.float32)
    v[i] = 1
    return v


class Chain(torch.nn.Module):
    """post_block of layers 0, 1, 2 as identity modules: the hooks steer the residual in place."""

    def __init__(self) -> None:
        super().__init__()
        self.points = torch.nn.ModuleList(torch.nn.Identity() for _ in range(LAYERS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.points:
            x = m(x)
        return x


@pytest.fixture
def owner(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=D, layers=LAYERS) as o:
        o.register_vector("p", [("post_block", 1, 1.0, _unit(0))], kind="probe")
        o.register_vector("s", [("post_block", l, 1.0, _unit(1)) for l in range(LAYERS)])
        yield o


def _own_steering() -> Dict[str, Any]:
    """The request's own steering: dimension 2 at every layer, 1 in decode rows, 3 in prefill."""
    vec = lambda s: [{"hook": "post_block", "layer": l, "scale": s, "data": _unit(2).tolist()} for l in range(LAYERS)]  # noqa: E731
    return {"decode": {"vectors": vec(1.0)}, "prefill": {"vectors": vec(3.0)}}


def _hooks(owner: Any, path: str, dtype: torch.dtype, rows: int, **kw: Any) -> Tuple[SteeringHooks, Chain]:
    if path == "native":
        h = SteeringHooks(owner, **kw)
    elif path == "device":
        h = SteeringHooks(owner, force_device_path=True, **kw)
    else:
        h = SteeringHooks(owner, static=True, max_tokens=rows, device="cpu", dtype=dtype, max_row_gates=2, **kw)
    chain = Chain()
    for l, m in enumerate(chain.points):
        h.attach(m, "post_block", l)
    return h, chain


def _run(h: SteeringHooks, chain: Chain, x: torch.Tensor, spans: Sequence[Any]) -> torch.Tensor:
    y = x.clone()
    with torch.no_grad():
        if h.static:
            h.prepare(spans)
            chain(y)
            h.report()
        else:
            with h.step(spans):
                chain(y)
    return y


MIXED, QUIET, FIRE = [0.9, 0.1], [0.1, 0.1], [0.9, 0.9]
CASES: List[Tuple[str, List[Dict[str, Any]], List[Tuple[List[float], str]]]] = [
    ("this_token probe", [{"when": PROBE, "scope": "this_token", "apply": ADD}],
     [(MIXED, "decode"), (QUIET, "decode"), (FIRE, "decode")]),
    ("this_token always", [{"when": ALWAYS, "scope": "this_token", "apply": ADD}], [(QUIET, "decode"), (FIRE, "decode")]),
    ("next_step probe", [{"when": PROBE, "scope": "next_step", "apply": ADD}],
     [(QUIET, "decode"), (FIRE, "decode"), (QUIET, "decode"), (QUIET, "decode"), (FIRE, "decode"), (FIRE, "decode"), (QUIET, "decode")]),
    ("next_step row mean", [{"when": PROBE, "scope": "next_step", "apply": ADD}],
     [([0.9, 0.2], "decode"), (QUIET, "decode"), ([0.7, 0.2], "decode"), (QUIET, "decode")]),
    ("next_step always", [{"when": ALWAYS, "scope": "next_step", "apply": ADD}], [(QUIET, "decode")] * 3),
    ("rest_of_request", [{"when": PROBE, "scope": "rest_of_request", "apply": ADD}],
     [(QUIET, "decode"), (FIRE, "decode"), (QUIET, "decode"), (QUIET, "decode")]),
    ("rest_of_conversation", [{"when": PROBE, "scope": "rest_of_conversation", "apply": ADD}],
     [(FIRE, "decode"), (QUIET, "decode"), (QUIET, "decode")]),
    ("prefill never gated", [{"when": ALWAYS, "scope": "this_token", "apply": ADD}, {"when": ALWAYS, "scope": "this_token", "apply": _atten(0)}],
     [(FIRE, "prefill"), (FIRE, "prefill")]),
    ("attenuate always", [{"when": ALWAYS, "scope": "this_token", "apply": _atten(0.25)}], [(QUIET, "decode"), (FIRE, "decode")]),
    ("attenuate next_step with an add", [{"when": PROBE, "scope": "next_step", "apply": _atten(0.5)},
                                         {"when": ALWAYS, "scope": "this_token", "apply": ADD}],
     [(FIRE, "decode"), (QUIET, "decode"), (QUIET, "decode")]),
    ("two probe gates per row", [{"when": PROBE, "scope": "this_token", "apply": ADD},
                                 {"when": PROBE, "scope": "rest_of_request", "apply": _atten(0.5)}],
     [(MIXED, "decode"), (QUIET, "decode"), (MIXED, "decode")]),
]


def _input(h0: Sequence[float], dtype: torch.dtype) -> torch.Tensor:
    x = torch.zeros(len(h0), D)
    x[:, 0] = torch.tensor(h0)
    return x.to(dtype)


@pytest.mark.parametrize("path", ["device", "static"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gates_device_equal_native(owner, case, path):
    name, gates, steps = case
    owner.admit("r", override=_own_steering(), steering=gates, conversation="c")
    nat, cn = _hooks(owner, "native", torch.float32, 2)
    dev, cd = _hooks(owner, path, torch.float32, 2)
    for i, (h0, phase) in enumerate(steps):
        x = _input(h0, torch.float32)
        spans = [("r", 0, len(h0), phase)]
        want = _run(nat, cn, x, spans)
        got = _run(dev, cd, x, spans)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5, msg=f"{name} step {i}")
        assert dev.stepper.stats()["gate_checksum"] == nat.stepper.stats()["gate_checksum"], f"{name} step {i}: decisions"
    sn, sd = nat.stepper.stats(), dev.stepper.stats()
    assert sd["gate_scopes"] == sn["gate_scopes"] and sd["gate_fires"] == sn["gate_fires"]
    assert sd["gate_reports_missed"] == 0
    if any(g["when"]["kind"] == "probe" for g in gates):
        assert sd["gate_evaluations"] > 0


def test_this_token_steers_the_firing_row_only(owner):
    """The README's example on the device path: the firing row gets the add from the probe's
    layer on (2 × strength 2), the quiet one nothing."""
    owner.admit("r", steering=[{"when": PROBE, "scope": "this_token", "apply": ADD}])
    for path in ("device", "static"):
        h, chain = _hooks(owner, path, torch.float32, 2)
        y = _run(h, chain, _input(MIXED, torch.float32), [("r", 0, 2, "decode")])
        assert y[0, 1].item() == pytest.approx(4.0, abs=1e-5) and abs(y[1, 1].item()) < 1e-6, (path, y)
        assert h.stepper.stats()["gate_scopes"]["this_token"] == {"evaluations": 1, "fires": 1, "engaged": 0}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("path", ["device", "static"])
def test_gates_every_dtype(owner, dtype, path):
    """Random residuals and two requests, every scope: the same decisions as the native path
    (which steers bf16/f16 through a float32 copy), outputs within the dtype's rounding."""
    rng = np.random.default_rng(3)
    for i, scope in enumerate(("this_token", "next_step", "rest_of_request", "rest_of_conversation")):
        owner.admit(f"q{i}", override=_own_steering(), conversation=f"c{i}",
                    steering=[{"when": dict(PROBE, threshold=0.0, sharpness=4), "scope": scope, "apply": ADD},
                              {"when": dict(PROBE, threshold=0.0, sharpness=4), "scope": "next_step", "apply": _atten(0.5)}])
    rows = 8
    nat, cn = _hooks(owner, "native", dtype, rows)
    dev, cd = _hooks(owner, path, dtype, rows)
    unit = {torch.float32: 2e-7, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}[dtype]
    for step in range(8):
        x = torch.from_numpy(rng.standard_normal((rows, D)).astype(np.float32))
        x[:, 0] = torch.from_numpy(np.where(rng.random(rows) < 0.5, 1.0, -1.0).astype(np.float32))  # clear margins
        x = x.to(dtype)
        spans = [(f"q{i}", 2 * i, 2 * i + 2, "decode") for i in range(4)]
        want = _run(nat, cn, x, spans).double()
        got = _run(dev, cd, x, spans).double()
        # Each of the 3 sites rounds at most 3 times on the device path (table row, gather-add,
        # gated add) against once natively: a bound of 4 roundings per site of the largest value.
        bound = 3 * 4 * unit * (1 + want.abs().max().item())
        assert (got - want).abs().max().item() <= bound, f"{dtype} {path} step {step}"
        assert dev.stepper.stats()["gate_checksum"] == nat.stepper.stats()["gate_checksum"], f"step {step}"
    assert dev.stepper.stats()["gate_scopes"] == nat.stepper.stats()["gate_scopes"]
    assert nat.stepper.stats()["gate_fires"] > 0


def test_inline_sources_on_the_device_path(owner):
    def packed(layer: int, v: np.ndarray) -> Dict[str, Any]:
        v = v.reshape(1, -1).astype(np.float32)
        return {"dtype": "float32", "shape": list(v.shape), "layer_indices": [layer], "data": base64.b64encode(v.tobytes()).decode()}
    probe = {"kind": "probe", "probe": {"kind": "inline", "packed": {"post_block": packed(1, _unit(0))}}, "threshold": 0.5, "sharpness": 100}
    owner.admit("r", steering=[{"when": probe, "scope": "this_token",
                                "apply": {"kind": "add", "steer": {"kind": "inline", "packed": {"post_block": packed(2, _unit(3))}}}}])
    h, chain = _hooks(owner, "device", torch.float32, 2)
    y = _run(h, chain, _input(MIXED, torch.float32), [("r", 0, 2, "decode")])
    assert y[0, 3].item() == pytest.approx(1.0, abs=1e-5) and y[1, 3].item() == pytest.approx(0.0, abs=1e-6)


def test_static_gates_allocate_nothing_per_step(owner):
    """Static mode: a step's hooked forward with gate columns allocates no tensor (the gate and
    score stay in persistent per-token buffers, as a captured graph needs)."""
    owner.admit("r", override=_own_steering(), steering=[{"when": PROBE, "scope": "this_token", "apply": ADD},
                                                         {"when": PROBE, "scope": "next_step", "apply": _atten(0.5)}])
    h, chain = _hooks(owner, "static", torch.float32, 2)
    spans = [("r", 0, 2, "decode")]
    x = _input(MIXED, torch.float32)
    _run(h, chain, x, spans)
    ptrs = {id(t): t.data_ptr() for t in (h._gates.gate, h._gates.score, h._gates.slots, h._gates.tables.probe, *h._gates.tables.adds.values())}
    y = x.clone()
    h.prepare(spans)
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        chain(y)
    allocs = [e.name for e in prof.events() if e.cpu_memory_usage > 0]
    assert allocs == [], f"the hooked forward allocated: {allocs}"
    h.report()
    assert {id(t): t.data_ptr() for t in (h._gates.gate, h._gates.score, h._gates.slots, h._gates.tables.probe, *h._gates.tables.adds.values())} == ptrs
    assert y[0, 1].item() > 3.9 and abs(y[1, 1].item()) < 1e-5


def test_static_without_gate_columns_refuses_probe_gates(owner):
    owner.admit("r", steering=[{"when": PROBE, "scope": "this_token", "apply": ADD}])
    h = SteeringHooks(owner, static=True, max_tokens=2, device="cpu", dtype=torch.float32)
    with pytest.raises(BatchCapacityError, match="max_row_gates"):
        h.prepare([("r", 0, 2, "decode")])


def test_one_report_per_gated_step(owner):
    """A gated device step makes one resolve and one report; an ungated one only the resolve."""
    owner.admit("g", steering=[{"when": PROBE, "scope": "next_step", "apply": ADD}])
    owner.admit("plain", override=_own_steering())
    h, chain = _hooks(owner, "device", torch.float32, 2)
    _run(h, chain, _input(FIRE, torch.float32), [("plain", 0, 2, "decode")])
    calls = h.engine_calls
    _run(h, chain, _input(FIRE, torch.float32), [("plain", 0, 2, "decode")])
    assert h.engine_calls - calls == 1 and h.batch.reports == 0
    _run(h, chain, _input(FIRE, torch.float32), [("g", 0, 2, "decode")])
    assert h.engine_calls - calls == 3 and h.batch.reports == 1


def test_c_admit_takes_the_forks_packed_inline_source(owner):
    """shmsteer_request_admit_json (the C ABI, no Python conversion) takes the fork's inline
    SOURCE {"kind": "inline", "packed": {hook: SteeringHookPacked}}; a bad blob is BAD_GATE."""
    import ctypes
    import json
    from shmsteer import _lib, errors

    def packed(layer: int, v: np.ndarray) -> Dict[str, Any]:
        v = v.reshape(1, -1).astype(np.float32)
        return {"dtype": "float32", "shape": list(v.shape), "layer_indices": [layer], "data": base64.b64encode(v.tobytes()).decode()}

    def admit(rid: str, steering: List[Dict[str, Any]]) -> None:
        js = json.dumps({"steering": steering}).encode()
        v = ctypes.c_uint64()
        _lib.check(_lib.lib.shmsteer_request_admit_json(owner.handle, rid.encode(), len(rid), js, len(js), ctypes.byref(v)))

    probe = {"kind": "probe", "probe": {"kind": "inline", "packed": {"post_block": packed(1, _unit(0))}}, "threshold": 0.5, "sharpness": 100}
    admit("c", [{"when": probe, "scope": "this_token",
                 "apply": {"kind": "add", "steer": {"kind": "inline", "packed": {"post_block": packed(2, _unit(4))}}, "strength": 3}}])
    for path in ("native", "device"):
        h, chain = _hooks(owner, path, torch.float32, 2)
        y = _run(h, chain, _input(MIXED, torch.float32), [("c", 0, 2, "decode")])
        assert y[0, 4].item() == pytest.approx(3.0, abs=1e-5) and abs(y[1, 4].item()) < 1e-6, (path, y)
    bad = dict(probe, probe={"kind": "inline", "packed": {"post_block": dict(packed(1, _unit(0)), dtype="int8")}})
    with pytest.raises(errors.BadGateError, match="dtype 'int8'"):
        admit("bad", [{"when": bad, "scope": "next_step", "apply": {"kind": "attenuate", "strength": 0.5}}])


def test_static_gate_sites(owner):
    """Static gate work only at the declared gate_sites: the same result as at every site, and a
    step whose gates reach outside them is BatchCapacityError."""
    owner.admit("r", override=_own_steering(), steering=[{"when": PROBE, "scope": "this_token", "apply": ADD}])
    nat, cn = _hooks(owner, "native", torch.float32, 2)
    owner.register_vector("s12", [("post_block", l, 1.0, _unit(1)) for l in (1, 2)])
    owner.admit("r", override=_own_steering(), steering=[
        {"when": PROBE, "scope": "this_token", "apply": {"kind": "add", "steer": {"kind": "name", "name": "s12"}, "strength": 2}}])
    h = SteeringHooks(owner, static=True, max_tokens=2, device="cpu", dtype=torch.float32, max_row_gates=1,
                      gate_sites=[("post_block", 1), ("post_block", 2)])
    chain = Chain()
    for l, m in enumerate(chain.points):
        h.attach(m, "post_block", l)
    assert sorted(h._gates.tables.adds) == [owner.hook_id("post_block") * LAYERS + l for l in (1, 2)]
    x = _input(MIXED, torch.float32)
    torch.testing.assert_close(_run(h, chain, x, [("r", 0, 2, "decode")]), _run(nat, cn, x, [("r", 0, 2, "decode")]), rtol=0, atol=1e-5)
    h2 = SteeringHooks(owner, static=True, max_tokens=2, device="cpu", dtype=torch.float32, max_row_gates=1,
                       gate_sites=[("post_block", 1)])
    with pytest.raises(BatchCapacityError, match="gate_sites"):
        h2.prepare([("r", 0, 2, "decode")])


@pytest.mark.parametrize("order", ["forward", "reversed"])
def test_gated_adds_skip_sites_before_their_probe(owner, monkeypatch, order):
    """A site whose gated adds' probes have not run yet in the step adds nothing (every gate is
    still 0), so the eager device path skips its add operator; in any order of the sites, the
    output is the native path's."""
    from shmsteer import _hooks_parts, ops
    owner.admit("r", steering=[{"when": PROBE, "scope": "this_token", "apply": ADD}])
    nat, cn = _hooks(owner, "native", torch.float32, 2)
    dev, cd = _hooks(owner, "device", torch.float32, 2)
    if order == "reversed":
        for c in (cn, cd):
            c.points = torch.nn.ModuleList(reversed(list(c.points)))
    at: List[int] = []  # the site of the running EagerGates.add
    calls: List[int] = []  # the sites that ran the add operator
    add, op = _hooks_parts.EagerGates.add, ops.site_gate_add_
    monkeypatch.setattr(_hooks_parts.EagerGates, "add", lambda self, t, site: (at.append(site), add(self, t, site))[1])
    monkeypatch.setattr(ops, "site_gate_add_", lambda *a: (calls.append(at[-1]), op(*a))[1])
    x = _input(MIXED, torch.float32)
    want = _run(nat, cn, x, [("r", 0, 2, "decode")])
    got = _run(dev, cd, x, [("r", 0, 2, "decode")])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert len(at) == 3  # every site asked
    layer = {site: i for i, site in enumerate(at if order == "forward" else reversed(at))}
    assert [layer[s] for s in calls] == ([1, 2] if order == "forward" else [1, 0]), calls


def test_gate_tables_reindexed_when_requests_leave(owner, monkeypatch):
    """A gated batch whose requests leave and move: each step whose rows are rows of the last
    step (same gate slots and factors) re-indexes the per-site gate tables instead of rebuilding
    them; the outputs and decisions equal the native path's, and a device path that always
    rebuilds gives the same bits."""
    owner.register_vector("q", [("post_block", 1, 1.0, _unit(3))], kind="probe")
    probe_q = dict(PROBE, probe={"kind": "name", "name": "q"})
    gated = {"r0": [{"when": PROBE, "scope": "this_token", "apply": ADD}],
             "r1": [{"when": probe_q, "scope": "this_token", "apply": ADD},
                    {"when": PROBE, "scope": "rest_of_request", "apply": _atten(0.5)}],
             "r2": [{"when": PROBE, "scope": "next_step", "apply": ADD}],
             "r3": [],
             "r4": [{"when": ALWAYS, "scope": "this_token", "apply": ADD}],
             "r5": [{"when": probe_q, "scope": "this_token", "apply": ADD}]}
    for rid, gates in gated.items():
        owner.admit(rid, override=_own_steering(), steering=gates)
    nat, cn = _hooks(owner, "native", torch.float32, 6)
    dev, cd = _hooks(owner, "device", torch.float32, 6)
    full, cf = _hooks(owner, "device", torch.float32, 6)
    monkeypatch.setattr(full._gates, "_relayout", lambda *a: False)
    layouts = [["r0", "r5", "r1", "r2", "r3", "r4"], ["r0", "r5", "r1", "r2", "r3", "r4"], ["r0", "r5", "r1", "r3", "r4"],
               ["r4", "r0", "r1", "r5", "r3"], ["r4", "r1", "r5", "r3"], ["r5", "r4", "r3"], ["r3", "r5", "r4"], ["r5"]]
    levels = [0.9, 0.1, 0.8, 0.2, 0.7, 0.3]
    for i, ids in enumerate(layouts):
        x = _input([levels[(i + j) % len(levels)] for j in range(len(ids))], torch.float32)
        x[:, 3] = 1 - x[:, 0]  # p fires exactly where q does not: a row probing with the other's probe flips
        spans = [(rid, j, j + 1, "decode") for j, rid in enumerate(ids)]
        want = _run(nat, cn, x, spans)
        got = _run(dev, cd, x, spans)
        again = _run(full, cf, x, spans)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5, msg=f"step {i}")
        assert torch.equal(got, again), f"step {i}: re-indexed and rebuilt tables differ"
        assert dev.stepper.stats()["gate_checksum"] == nat.stepper.stats()["gate_checksum"], f"step {i}: decisions"
    assert dev._gates.relayouts >= 2 and full._gates.relayouts == 0, (dev._gates.relayouts, dev._gates.builds)
    assert dev._gates.builds < full._gates.builds
