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


def run(ns, secret, dtype, device_path: bool, decode_steps: int = 3, device: str = "cpu"):
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
        capture.serve_capture(o, {"py": "filesystem"})
        layers = [Layer() for _ in range(LAYERS)]
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
                with torch.inference_mode(), hooks.step(spans):
                    for m in layers:
                        out = m(None)
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


@pytest.mark.parametrize("device_path", [False, True], ids=["native", "device"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
def test_hooks_capture_rows_bitwise(ns, secret, dtype, device_path):
    want, got = run(ns, secret, dtype, device_path)
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
