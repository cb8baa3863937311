"""Continuous batching as the normal case: every path (native, eager device, static on CPU
tensors), float32 and bfloat16, through a decode loop whose batch grows and shrinks, requests
joining (prefill in chunks) and finishing mid-run, and a request owning several rows of one
decode step; steering and clamps against the float64 reference of steering_ref, capture bit for
bit against the rows the hooks saw, probe gates against the native path's decisions."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not importable")

import shmsteer  # noqa: E402
from shmsteer import capture  # noqa: E402
from shmsteer.capture import Begin, Consumer, End, Record  # noqa: E402
from shmsteer.torch_hook import SteeringHooks  # noqa: E402

from steering_ref import HIDDEN, HOOKS, LAYERS, Chain, Scenario, assert_close_to_reference, attach  # noqa: E402

MAX_TOKENS = 24
PATHS = ["native", "device", "static"]
DTYPES = [torch.float32, torch.bfloat16]

# (request, step it joins at, prompt length, tokens generated, rows per decode step). a..d come
# from the Scenario (admitted before the loop); e and f are admitted when they join, with a
# capture of pre_attn layer 0 (the rows as the model made them: the input here).
SCHEDULE = [("a", 0, 5, 3, 1), ("b", 0, 2, 6, 2), ("c", 1, 7, 2, 1), ("d", 2, 1, 4, 3),
            ("e", 3, 4, 3, 1), ("f", 5, 3, 4, 2)]


def make_hooks(o: Any, path: str, dtype: torch.dtype, **kw: Any) -> SteeringHooks:
    if path == "native":
        return SteeringHooks(o, **kw)
    if path == "device":
        return SteeringHooks(o, force_device_path=True, **kw)
    return SteeringHooks(o, static=True, max_tokens=MAX_TOKENS, device="cpu", dtype=dtype, **kw)


def forward(hooks: SteeringHooks, chain: torch.nn.Module, x: torch.Tensor, spans: Sequence[Any]) -> torch.Tensor:
    """One step; static mode runs its padded batch of MAX_TOKENS rows as a captured graph would."""
    with torch.inference_mode():
        if hooks.static:
            y = torch.zeros(MAX_TOKENS, HIDDEN, dtype=x.dtype)
            y[: x.shape[0]] = x
            hooks.prepare(spans)
            chain(y)
            hooks.report()
            return y[: x.shape[0]]
        y = x.clone()
        with hooks.step(spans):
            chain(y)
        return y


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("path", PATHS)
def test_continuous_batching_steers_and_captures(ns, secret, path, dtype):
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS, hooks=list(HOOKS)) as o:
        capture.serve_capture(o, {"py": "filesystem"})
        sc = Scenario(o, seed=7)
        chain = Chain()
        hooks = make_hooks(o, path, dtype)
        attach(hooks, chain)
        hooks.start_capture()
        rng = np.random.default_rng(5)
        gen = torch.Generator().manual_seed(9)
        want: Dict[str, List[Tuple[int, torch.Tensor]]] = {}
        with Consumer(ns, "py", secret=secret) as consumer:
            assert consumer.next(timeout=0.2) is None

            def join(rid: str, prompt: int) -> None:
                if rid in ("e", "f"):
                    own = {"decode": {"vectors": [sc.vec("post_block", int(rng.integers(LAYERS)), 1.5)]},
                           "base": {"clamps": [sc.clamp("pre_attn", 1, -0.1, 0.2, 1.0)]}}
                    o.admit(rid, override=own, prompt_len=prompt,
                            capture={"py": {"request_id": rid, "tag": "t", "hooks": {"pre_attn": [0]}, "positions": "all"}})
                    sc.reqs[rid] = own

            ends: List[str] = []
            rows_seen = []
            step_spans: List[List[Tuple[str, int, int, str, int]]] = []
            done: Dict[str, int] = {}
            step = 0
            while True:
                spans, row = [], 0
                for rid, join_at, prompt, ngen, per in SCHEDULE:
                    if step < join_at or done.get(rid, 0) >= prompt + ngen:
                        continue
                    if step == join_at:
                        join(rid, prompt)
                        done[rid] = 0
                    k = done[rid]
                    n, phase = (min(3, prompt - k), "prefill") if k < prompt else (min(per, prompt + ngen - k), "decode")
                    spans.append((rid, row, row + n, phase, k))
                    row += n
                if not spans:
                    break
                x = torch.randn(row, HIDDEN, generator=gen).to(dtype)
                for rid, a, b, _, k in spans:
                    if rid in ("e", "f"):
                        want.setdefault(rid, []).extend((k + i, x[a + i].clone()) for i in range(b - a))
                got = forward(hooks, chain, x, spans)
                ref = sc.reference(x, [s[:4] for s in spans])
                assert_close_to_reference(got, ref, dtype, f"{path} step {step} ({row} rows)",
                                          roundings_per_site=1 if path == "native" else 2)
                for rid, a, b, _, _ in spans:
                    done[rid] += b - a
                for rid, _, prompt, ngen, _ in SCHEDULE:  # finished requests leave the batch
                    if done.get(rid, -1) == prompt + ngen and rid not in ends:
                        ends.append(rid)
                        sc.end(rid)
                rows_seen.append(row)
                step_spans.append(spans)
                step += 1
            # The batch grew and shrank; some decode step gave one request several rows.
            assert max(rows_seen) > rows_seen[0] and rows_seen[-1] < max(rows_seen), rows_seen
            assert any(s[3] == "decode" and s[2] - s[1] > 1 for sp in step_spans for s in sp)
            got_rows: Dict[str, List[Tuple[int, np.ndarray]]] = {}
            finished = set()
            for _ in range(10000):
                ev = consumer.next(timeout=5.0)
                assert ev is not None, "no capture event within 5 s"
                if isinstance(ev, Record):
                    assert (ev.hook, ev.layer) == ("pre_attn", 0)
                    got_rows.setdefault(ev.request_id, []).extend(zip(ev.positions.tolist(), ev.data.copy()))
                elif isinstance(ev, End):
                    finished.add(ev.request_id)
                    if finished >= {"e", "f"}:
                        break
                else:
                    assert isinstance(ev, Begin)
        hooks.close()
        raw = {torch.float32: np.int32, torch.bfloat16: np.int16}[dtype]
        assert set(got_rows) == {"e", "f"}
        for rid, rows in want.items():
            assert [p for p, _ in got_rows[rid]] == [p for p, _ in rows], rid
            expect = torch.stack([r for _, r in rows]).view(torch.int32 if raw is np.int32 else torch.int16).numpy()
            data = np.stack([d for _, d in got_rows[rid]]).view(raw)
            assert data.tolist() == expect.tolist(), rid


# ---- probe gates through a growing and shrinking batch, against the native path -----------

D, GL = 8, 3


def _unit(i: int) -> np.ndarray:
    v = np.zeros(D, np.float32)
    v[i] = 1
    return v


class GateChain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.points = torch.nn.ModuleList(torch.nn.Identity() for _ in range(GL))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.points:
            x = m(x)
        return x


PROBE = {"kind": "probe", "probe": {"kind": "name", "name": "p"}, "threshold": 0.5, "sharpness": 100}
GATES = [{"when": PROBE, "scope": "this_token", "apply": {"kind": "add", "steer": {"kind": "name", "name": "s"}, "strength": 2}},
         {"when": PROBE, "scope": "next_step", "apply": {"kind": "attenuate", "strength": 0.5}}]


@pytest.fixture
def gate_owner(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=D, layers=GL) as o:
        o.register_vector("p", [("post_block", 1, 1.0, _unit(0))], kind="probe")
        o.register_vector("s", [("post_block", l, 1.0, _unit(1)) for l in range(GL)])
        yield o


def _gate_hooks(o: Any, path: str, dtype: torch.dtype) -> Tuple[SteeringHooks, GateChain]:
    if path == "static":
        h = SteeringHooks(o, static=True, max_tokens=MAX_TOKENS, device="cpu", dtype=dtype, max_row_gates=2)
    else:
        h = make_hooks(o, path, dtype)
    chain = GateChain()
    for l, m in enumerate(chain.points):
        h.attach(m, "post_block", l)
    return h, chain


def _own() -> Dict[str, Any]:
    vec = [{"hook": "post_block", "layer": l, "scale": 1.0, "data": _unit(2).tolist()} for l in range(GL)]
    return {"decode": {"vectors": vec}}


def _gated_forward(h: SteeringHooks, chain: GateChain, x: torch.Tensor, spans: Sequence[Any]) -> torch.Tensor:
    with torch.inference_mode():
        if h.static:
            y = torch.zeros(MAX_TOKENS, D, dtype=x.dtype)
            y[: x.shape[0]] = x
            h.prepare(spans)
            chain(y)
            h.report()
            return y[: x.shape[0]]
        y = x.clone()
        with h.step(spans):
            chain(y)
        return y


@pytest.mark.parametrize("path", ["device", "static"])
def test_gated_batch_shrinks_then_grows(gate_owner, path):
    """The crash of issue 39: two steps of a gated batch, 2 rows then 1 row (then 3), on the
    device path loaded the gates with the previous step's rows."""
    gate_owner.admit("r", override=_own(), steering=GATES)
    gate_owner.admit("q", override=_own(), steering=GATES)
    nat, cn = _gate_hooks(gate_owner, "native", torch.float32)
    dev, cd = _gate_hooks(gate_owner, path, torch.float32)
    for i, spans in enumerate([[("r", 0, 2, "decode")], [("r", 0, 1, "decode")],
                               [("r", 0, 1, "decode"), ("q", 1, 3, "decode")], [("q", 0, 1, "decode")]]):
        x = torch.zeros(spans[-1][2], D)
        x[:, 0] = torch.tensor([0.9, 0.1, 0.8][: x.shape[0]])
        want = _gated_forward(nat, cn, x, spans)
        got = _gated_forward(dev, cd, x, spans)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5, msg=f"step {i}")
        assert dev.stepper.stats()["gate_checksum"] == nat.stepper.stats()["gate_checksum"], f"step {i}"
    assert dev.stepper.stats()["gate_reports_missed"] == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("path", ["device", "static"])
def test_continuous_batching_gates_equal_native(gate_owner, path, dtype):
    """Gated requests joining and finishing, several rows of one decode step: the device and
    static paths add what the native path adds and take the same gate decisions, every step."""
    nat, cn = _gate_hooks(gate_owner, "native", dtype)
    dev, cd = _gate_hooks(gate_owner, path, dtype)
    gen = torch.Generator().manual_seed(4)
    sched = [("g0", 0, 2, 5, 1), ("g1", 1, 3, 3, 2), ("g2", 2, 1, 4, 1), ("plain", 0, 2, 6, 3)]
    done: Dict[str, int] = {}
    sizes = []
    for step in range(12):
        spans, row = [], 0
        for rid, join, prompt, ngen, per in sched:
            if step < join or done.get(rid, 0) >= prompt + ngen:
                continue
            if step == join:
                gate_owner.admit(rid, override=_own(), steering=None if rid == "plain" else GATES)
                done[rid] = 0
            k = done[rid]
            n, phase = (min(2, prompt - k), "prefill") if k < prompt else (min(per, prompt + ngen - k), "decode")
            spans.append((rid, row, row + n, phase))
            row += n
        if not spans:
            break
        x = torch.zeros(row, D)
        x[:, 0] = torch.rand(row, generator=gen)
        x = x.to(dtype)
        want = _gated_forward(nat, cn, x, spans)
        got = _gated_forward(dev, cd, x, spans)
        tol = 1e-5 if dtype == torch.float32 else 0.05
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=tol, msg=f"step {step} ({row} rows)")
        assert dev.stepper.stats()["gate_checksum"] == nat.stepper.stats()["gate_checksum"], f"step {step}"
        for rid, a, b, _ in spans:
            done[rid] += b - a
        for rid, _, prompt, ngen, _ in sched:
            if done.get(rid) == prompt + ngen:
                gate_owner.end(rid)
                done[rid] += 1  # ended once
        sizes.append(row)
    assert max(sizes) > sizes[0] and sizes[-1] < max(sizes), sizes
    sd, sn = dev.stepper.stats(), nat.stepper.stats()
    assert sd["gate_scopes"] == sn["gate_scopes"] and sd["gate_reports_missed"] == 0
    assert sd["gate_evaluations"] > 0


def test_native_batch_checksum_changes_per_step(ns, secret):
    """Issue 41 #14: the native path's batch checksum is each step's (a prefill and three
    decode steps differ), and equals the device path's for the same batch."""
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS, hooks=list(HOOKS)) as o:
        Scenario(o)
        nat, dev = SteeringHooks(o), SteeringHooks(o, force_device_path=True)
        cn, cd = Chain(), Chain()
        attach(nat, cn)
        attach(dev, cd)
        steps = [[("a", 0, 4, "prefill")]] + [[("a", 0, 1, "decode"), ("b", 1, 1 + i, "decode")] for i in (1, 2, 3)]
        seen = []
        for spans in steps:
            x = torch.randn(spans[-1][2], HIDDEN)
            for h, c in ((nat, cn), (dev, cd)):
                with torch.no_grad(), h.step(spans):
                    c(x.clone())
            assert nat.batch_checksum == dev.batch_checksum != 0
            seen.append(nat.batch_checksum)
        assert len(set(seen)) == len(seen), [hex(s) for s in seen]
