"""Capture at SteeringHooks: the rows admitted requests capture reach a Python consumer bitwise as
the hooks saw them (before steering), on the native and device paths, float32, bfloat16 and
float16; 5-tuple spans carry the positions, 4-tuples keep working; Owner.admit validates."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not importable (apt-get install python3-torch)")

import shmsteer  # noqa: E402
from shmsteer import capture  # noqa: E402
from shmsteer.capture import Begin, Consumer, End, Record  # noqa: E402
from shmsteer.torch_hook import SteeringHooks  # noqa: E402

HIDDEN, LAYERS = 16, 3


class Layer(torch.nn.Module):
    """Outputs the tensor the test queued for it (a known hidden state per step)."""

    def __init__(self) -> None:
        super().__init__()
        self.out: torch.Tensor = torch.zeros(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out


def spec(rid: str, hooks, positions):
    return {"request_id": rid, "tag": "t", "hooks": hooks, "positions": positions}


# (request id, prompt length, capture spec or None): every position selector.
REQUESTS = [
    ("last", 5, spec("last", {"post_block": [0, 2]}, "last_prompt")),
    ("prompt", 4, spec("prompt", {"post_block": "all"}, "all_prompt")),
    ("gen", 3, spec("gen", {"post_block": {"layers": [1]}}, "all_generated")),
    ("all", 2, spec("all", {"post_block": {"ranges": [[1, 2]]}}, "all")),
    ("list", 6, spec("list", {"post_block": [1]}, [0, 5, 3])),
    ("plain", 3, None),  # not captured, 4-tuple spans
]


def selects(sel, prompt: int, pos: int) -> bool:
    if sel == "last_prompt":
        return pos == prompt - 1
    if sel == "all_prompt":
        return pos < prompt
    if sel == "all_generated":
        return pos >= prompt
    if sel == "all":
        return True
    return pos in sel


def layers_of(hooks) -> list:
    sel = hooks["post_block"]
    if sel == "all":
        return list(range(LAYERS))
    if isinstance(sel, list):
        return sel
    out = set(sel.get("layers") or [])
    for a, b in sel.get("ranges") or []:
        out.update(range(a, b + 1))
    return sorted(out)


MAX_TOKENS = 16  # static mode: more than any step's rows (6 requests, prefill chunks of 2)


def run(ns, secret, dtype, device_path: bool, decode_steps: int = 3, device: str = "cpu", static: bool = False):
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
        capture.serve_capture(o, {"py": "filesystem"})
        layers = [Layer() for _ in range(LAYERS)]
        if static:
            hooks = SteeringHooks(o, static=True, max_tokens=MAX_TOKENS, device=device, dtype=dtype)
        else:
            hooks = SteeringHooks(o, force_device_path=device_path)
        for i, m in enumerate(layers):
            hooks.attach(m, "post_block", i)
        hooks.start_capture()
        with Consumer(ns, "py", secret=secret) as c:
            assert c.next(timeout=0.2) is None  # the ring notice: c reads the hooks' ring from now on
            steer = {"base": {"vectors": [{"hook": "post_block", "layer": i, "scale": 1.0, "data": [1.0] * HIDDEN}
                                          for i in range(LAYERS)]}}
            for rid, prompt, sp in REQUESTS:
                o.admit(rid, override=steer, capture=None if sp is None else {"py": sp}, prompt_len=prompt)
            gen = torch.Generator().manual_seed(3)
            want: dict = {}
            done = {rid: 0 for rid, _, _ in REQUESTS}
            while True:
                spans, row = [], 0
                for rid, prompt, sp in REQUESTS:
                    if done[rid] < prompt:
                        n, phase = min(2, prompt - done[rid]), "prefill"
                    elif done[rid] < prompt + decode_steps:
                        n, phase = 1, "decode"
                    else:
                        continue
                    spans.append((rid, row, row + n, phase) if sp is None else (rid, row, row + n, phase, done[rid]))
                    row += n
                if not spans:
                    break
                outs = [torch.randn(row, HIDDEN, generator=gen).to(dtype).to(device) for _ in range(LAYERS)]
                for i, m in enumerate(layers):
                    m.out = outs[i].clone()
                for sp_ in spans:
                    rid, start, end = sp_[:3]
                    prompt, capspec = next((p, s) for r, p, s in REQUESTS if r == rid)
                    if capspec is None:
                        continue
                    for i in layers_of(capspec["hooks"]):
                        for r in range(start, end):
                            pos = done[rid] + r - start
                            if selects(capspec["positions"], prompt, pos):
                                want.setdefault((rid, i), []).append((pos, outs[i][r].cpu().clone()))
                if static:  # outside a graph here: the static path's hooks all the same
                    hooks.prepare(spans)
                    with torch.inference_mode():
                        for m in layers:
                            m(None)
                    hooks.report()
                else:
                    with torch.inference_mode(), hooks.step(spans):
                        for m in layers:
                            m(None)
                for i, m in enumerate(layers):  # steered after capture: the rows changed
                    assert not torch.equal(m.out, outs[i])
                for sp_ in spans:
                    done[sp_[0]] += sp_[2] - sp_[1]
            for rid, _, _ in REQUESTS:
                o.end(rid)
            got: dict = {}
            ends = set()
            begins = set()
            for _ in range(10000):
                ev = c.next(timeout=5.0)
                assert ev is not None, "no event within 5 s"
                if isinstance(ev, Begin):
                    begins.add(ev.request_id)
                elif isinstance(ev, Record):
                    assert ev.hook == "post_block" and ev.data.shape == (len(ev.positions), HIDDEN)
                    got.setdefault((ev.request_id, ev.layer), []).append((ev.positions.copy(), ev.data.copy(), ev.dtype))
                elif isinstance(ev, End):
                    ends.add(ev.request_id)
                    assert ev.dropped == 0
                    if len(ends) == len(begins) == 5:
                        break
            hooks.close()
            return want, got


@pytest.mark.parametrize("path", ["native", "device", "static"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
def test_hooks_capture_rows_bitwise(ns, secret, dtype, path):
    want, got = run(ns, secret, dtype, path == "device", static=path == "static")
    assert want, "the scenario captures nothing"
    assert set(got) == set(want)
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    raw = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[dtype]
    for k, rows in want.items():
        positions = np.concatenate([p for p, _, _ in got[k]])
        data = np.concatenate([d.reshape(-1) for _, d, _ in got[k]])
        assert {dt for _, _, dt in got[k]} == {name}
        assert positions.tolist() == [p for p, _ in rows], k
        expect = torch.stack([r for _, r in rows]).view(raw).numpy().reshape(-1)
        assert data.view(expect.dtype).tolist() == expect.tolist(), k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
def test_static_capture_equals_native(ns, secret, dtype):
    """Static (CUDA-graph) mode captures what the native path captures, record for record and
    bit for bit (CPU tensors through the static path: the same code a GPU's graph replays)."""
    _, native = run(ns, secret, dtype, False)
    _, static = run(ns, secret, dtype, False, static=True)
    assert native and set(static) == set(native)
    for k in native:
        assert len(static[k]) == len(native[k]), k
        for (pn, dn, tn), (ps, ds, ts) in zip(native[k], static[k]):
            assert tn == ts and pn.tolist() == ps.tolist(), k
            assert dn.tobytes() == ds.tobytes(), k


def test_static_capture_allocates_nothing_in_the_forward(ns, secret):
    """The static forward's capture work (a gather and an index copy per site into persistent
    buffers) allocates nothing; the buffers stay where the graph captured them; a step planning
    more rows than max_rows is BatchCapacityError; sites attach before start_capture."""
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
        capture.serve_capture(o, {"py": "filesystem"})
        layers = [Layer() for _ in range(LAYERS)]
        hooks = SteeringHooks(o, static=True, max_tokens=4, device="cpu", dtype=torch.float32)
        with pytest.raises(ValueError):
            hooks.start_capture()  # no site attached yet
        for i, m in enumerate(layers):
            hooks.attach(m, "post_block", i)
        hooks.start_capture(max_rows=6)
        with pytest.raises(RuntimeError):
            hooks.attach(torch.nn.Identity(), "pre_attn", 0)
        with Consumer(ns, "py", secret=secret) as c:
            assert c.next(timeout=0.2) is None
            o.admit("r", capture={"py": spec("r", {"post_block": "all"}, "all")}, prompt_len=2)
            spans = [("r", 0, 2, "prefill", 0)]
            x = torch.randn(2, HIDDEN)

            def forward() -> None:
                for m in layers:
                    m.out = x.clone()
                with torch.inference_mode():
                    for m in layers:
                        m(None)
            hooks.prepare(spans)
            forward()
            hooks.report()
            sc = hooks._scap
            ptrs = [t.data_ptr() for t in (sc._idx, sc.scratch[0], sc.buf, sc._host)]
            hooks.prepare([("r", 0, 1, "decode", 2)])
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                for m in layers:
                    m.out = x
                with torch.inference_mode():
                    for m in layers:
                        m(None)
            allocs = [e.name for e in prof.events() if e.cpu_memory_usage > 0]
            assert allocs == [], f"the static forward allocated: {allocs}"
            hooks.report()
            assert [t.data_ptr() for t in (sc._idx, sc.scratch[0], sc.buf, sc._host)] == ptrs
            o.admit("big", capture={"py": spec("big", {"post_block": "all"}, "all")}, prompt_len=3)
            with pytest.raises(shmsteer.errors.BatchCapacityError, match="max_rows"):
                hooks.prepare([("big", 0, 3, "prefill", 0)])  # 3 rows x 3 sites > 6
            o.end("r")
            got = []
            for _ in range(100):
                ev = c.next(timeout=5.0)
                assert ev is not None
                if isinstance(ev, Record):
                    got.append((ev.layer, ev.positions.tolist()))
                if isinstance(ev, End) and ev.request_id == "r":
                    break
            assert sorted(got) == sorted([(i, [0, 1]) for i in range(LAYERS)] + [(i, [2]) for i in range(LAYERS)])
        hooks.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: static capture is tested on CPU tensors through the static path")
def test_static_capture_cuda_graph(ns, secret):
    """On a GPU: the forward captured in a CUDA graph, replayed per step; its rows reach the
    consumer bitwise (one device-to-host copy per step into pinned memory)."""
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
        capture.serve_capture(o, {"py": "filesystem"})
        layers = [torch.nn.Identity() for _ in range(LAYERS)]
        hooks = SteeringHooks(o, static=True, max_tokens=4, device="cuda", dtype=torch.bfloat16)
        for i, m in enumerate(layers):
            hooks.attach(m, "post_block", i)
        hooks.start_capture()
        with Consumer(ns, "py", secret=secret) as c:
            assert c.next(timeout=0.2) is None
            o.admit("r", capture={"py": spec("r", {"post_block": "all"}, "all")}, prompt_len=4)
            o.admit("warmup")  # the graph's capture run steps a request that captures nothing
            x = torch.zeros(4, HIDDEN, dtype=torch.bfloat16, device="cuda")
            hooks.prepare([("warmup", 0, 4, "prefill")])
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):  # warm-up outside the graph, as torch's docs ask
                for m in layers:
                    m(x)
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y = x
                for m in layers:
                    y = m(y)
            want = []
            for step in range(3):
                hooks.prepare([("r", 0, 4, "prefill", 0)] if step == 0 else [("r", 0, 1, "decode", 3 + step)])
                x.copy_(torch.randn(4, HIDDEN).to(torch.bfloat16))
                want.append(x.cpu().clone())
                graph.replay()
                hooks.report()
            o.end("r")
            got = {}
            for _ in range(1000):
                ev = c.next(timeout=5.0)
                assert ev is not None
                if isinstance(ev, Record) and ev.layer == 0:
                    got.setdefault(tuple(ev.positions.tolist()), ev.data.copy())
                if isinstance(ev, End):
                    break
            assert got[(0, 1, 2, 3)].tobytes() == want[0].view(torch.int16).numpy().tobytes()
        hooks.close()


def test_admit_capture_refusals(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
        with pytest.raises(shmsteer.errors.CaptureConsumerError):
            o.admit("r", capture={"py": spec("r", {"post_block": [0]}, "all")}, prompt_len=3)  # no consumer yet
        capture.serve_capture(o, {"py": "filesystem"})
        for cap, prompt, exc in [
            ({"other": spec("r", {"post_block": [0]}, "all")}, 3, shmsteer.errors.CaptureConsumerError),
            ({"py": spec("r", {"post_block": [LAYERS]}, "all")}, 3, shmsteer.errors.CaptureLayerRangeError),
            ({"py": spec("r", {"post_mlp": [0]}, "all")}, 3, shmsteer.errors.CaptureHookError),
            ({"py": spec("r", {"post_block": [0]}, [3])}, 3, shmsteer.errors.CapturePositionRangeError),
            ({"py": spec("r", {"post_block": [0]}, "all")}, 0, shmsteer.errors.CapturePositionRangeError),
            ({"py": {"tag": "t"}}, 3, shmsteer.errors.CaptureSpecError),
            ({"py": spec("../r", {"post_block": [0]}, "all")}, 3, shmsteer.errors.CaptureSlugError),
        ]:
            with pytest.raises(exc):
                o.admit("r", capture=cap, prompt_len=prompt)
            assert o.status()["steer"]["admitted_requests"] == 0
        with pytest.raises(shmsteer.errors.InvalidArgumentError):
            o.admit("r", capture={"py": spec("r", {"post_block": [0]}, "all")}, prompt_len=-1)
        o.admit("r", capture={"py": spec("r", {"post_block": [0]}, "all")}, prompt_len=3)
        assert o.status()["steer"]["admitted_requests"] == 1


def test_spans_take_positions(ns, secret):
    """A 5-tuple's first_position reaches the engine: a captured decode span inside its prompt
    is refused (BadBatchError), the same span with its position steps."""
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
        capture.serve_capture(o, {"py": "filesystem"})
        o.admit("r", capture={"py": spec("r", {"post_block": "all"}, "all")}, prompt_len=4)
        st = o.stepper()
        st.capture_start()
        st.begin()
        a = np.zeros((1, HIDDEN), np.float32)
        with pytest.raises(shmsteer.errors.BadBatchError):
            st.apply("post_block", 0, a, [("r", 0, 1, "decode")])
        st.apply("post_block", 0, a, [("r", 0, 1, "decode", 4)])
        with pytest.raises(shmsteer.errors.InvalidArgumentError):
            st.apply("post_block", 0, a, [("r", 0, 1)])
        st.end()
        # Another rank captures nothing and needs no hub.
        st.capture_start(rank=1)
        st.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the device path's D2H copy is tested on CPU tensors")
def test_hooks_capture_cuda(ns, secret):
    """On a GPU: one gather and one device-to-host copy into pinned memory per site."""
    want, got = run(ns, secret, torch.bfloat16, True, device="cuda")
    assert want and set(got) == set(want)
    for k, rows in want.items():
        data = np.concatenate([d.reshape(-1) for _, d, _ in got[k]])
        expect = torch.stack([r for _, r in rows]).view(torch.int16).numpy().reshape(-1)
        assert data.view(expect.dtype).tolist() == expect.tolist(), k


def test_global_spec(ns, secret):
    """A consumer's global spec (serve_capture(..., global_specs=)) captures every request that
    does not name the consumer, under its own id; a request's own spec replaces it; one it cannot
    apply to is admitted with that consumer's result error; a bad global spec is a request's
    typed error and changes nothing."""
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
        g = {"tag": "every", "hooks": {"post_block": [1]}, "positions": "all"}
        with pytest.raises(shmsteer.errors.CaptureHookError):
            capture.serve_capture(o, {"py": "filesystem"}, {"py": dict(g, hooks={"post_mlp": [0]})})
        # The hub serves already (the first spec was refused, nothing else changed): the C call.
        import json as _json
        for bad, exc in [({"request_id": "x", **g}, shmsteer.errors.CaptureSpecError),
                         (dict(g, positions="every"), shmsteer.errors.CapturePositionsError),
                         (dict(g, hooks={"post_block": [LAYERS]}), shmsteer.errors.CaptureLayerRangeError)]:
            js = _json.dumps(bad).encode()
            with pytest.raises(exc):
                shmsteer._lib.check(capture.lib.shmsteer_capture_global(o.handle, b"py", 2, js, len(js)))
        o.admit("before", prompt_len=2)
        assert capture.capture_result(o, "before")["py"]["status"] == "not_requested"
        js = _json.dumps(g).encode()
        shmsteer._lib.check(capture.lib.shmsteer_capture_global(o.handle, b"py", 2, js, len(js)))
        layers = [Layer() for _ in range(LAYERS)]
        hooks = SteeringHooks(o)
        for i, m in enumerate(layers):
            hooks.attach(m, "post_block", i)
        hooks.start_capture()
        with Consumer(ns, "py", secret=secret) as c:
            assert c.next(timeout=0.2) is None
            o.admit("plain", prompt_len=2)
            o.admit("own", capture={"py": spec("mine", {"post_block": [2]}, "last_prompt")}, prompt_len=2)
            o.admit("noprompt")
            res = capture.capture_result(o, "noprompt")["py"]
            assert res["status"] == "error" and res["global"] is True and "global spec" in res["error"], res
            assert capture.capture_result(o, "plain")["py"] == {"status": "pending", "error": None, "payload": [], "global": True}
            assert "global" not in capture.capture_result(o, "own")["py"]
            x = torch.randn(6, HIDDEN)
            for m in layers:
                m.out = x.clone()
            spans = [("plain", 0, 2, "prefill", 0), ("own", 2, 4, "prefill", 0), ("noprompt", 4, 6, "prefill")]
            with torch.inference_mode(), hooks.step(spans):
                for m in layers:
                    m(None)
            for rid in ("plain", "own", "noprompt"):
                o.end(rid)
            begins, got, ends = {}, {}, set()
            for _ in range(1000):
                ev = c.next(timeout=5.0)
                assert ev is not None
                if isinstance(ev, Begin):
                    begins[ev.request_id] = ev.spec
                elif isinstance(ev, Record):
                    got[(ev.request_id, ev.layer)] = (ev.positions.tolist(), ev.data.copy())
                elif isinstance(ev, End):
                    ends.add(ev.request_id)
                    if ends == {"plain", "own"}:
                        break
            assert begins["plain"] == dict(g, request_id="plain") and begins["own"]["request_id"] == "mine"
            assert set(got) == {("plain", 1), ("own", 2)}
            assert got[("plain", 1)][0] == [0, 1] and got[("plain", 1)][1].tobytes() == x[0:2].numpy().tobytes()
            assert got[("own", 2)][0] == [1] and got[("own", 2)][1].tobytes() == x[3:4].numpy().tobytes()
        hooks.close()
