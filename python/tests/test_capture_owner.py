"""The owner's capture consumers given at start (``Owner(capture_consumers=, capture_global=)``)
and the in-process filesystem consumer (:class:`shmsteer.capture.FilesystemConsumer`): bad
declarations are refused with their typed errors and leave no owner behind; a request captured
by SteeringHooks is written in the fork's layout, read back by the fork's reader (the fixture
capture/testdata/fork_reader.py) with the rows the hooks saw before steering them."""

from __future__ import annotations

import importlib.util
import pathlib
import time
from typing import Any, Dict

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not importable (apt-get install python3-torch)")

import shmsteer  # noqa: E402
from shmsteer.capture import FilesystemConsumer  # noqa: E402
from shmsteer.errors import (CaptureConsumerError, CaptureConsumerNameError, CaptureConsumerTypeError,  # noqa: E402
                             CaptureHookError, CaptureLayoutError, ConsumerTakenError, UnknownConsumerError)
from shmsteer.torch_hook import SteeringHooks  # noqa: E402

HIDDEN, LAYERS = 16, 3
FORK_READER = pathlib.Path(__file__).resolve().parents[2] / "capture" / "testdata" / "fork_reader.py"


def fork_reader() -> Any:
    spec = importlib.util.spec_from_file_location("fork_reader", FORK_READER)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("decl, err", [
    ({"fs": "tape"}, CaptureConsumerTypeError),
    ({"fs": ""}, CaptureConsumerTypeError),
    ({"f s": "filesystem"}, CaptureConsumerNameError),
    ({"a,b": "filesystem"}, CaptureConsumerNameError),
    ({"a=b": "filesystem"}, CaptureConsumerNameError),
    ({"x" * 200: "filesystem"}, CaptureConsumerNameError),
    ({"fs": "filesystem", "other": "nope"}, CaptureConsumerTypeError),
], ids=["unknown-type", "empty-type", "space", "comma", "equals", "long", "one-bad"])
def test_bad_declaration_leaves_no_owner(ns, secret, decl, err):
    with pytest.raises(err):
        shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS, capture_consumers=decl)
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:  # the namespace is free
        with pytest.raises(CaptureConsumerError):
            o.admit("r", capture={"fs": {"request_id": "r", "tag": "t", "hooks": {"post_block": [0]},
                                         "positions": "all"}}, prompt_len=2)


def test_bad_global_spec_leaves_no_owner(ns, secret):
    with pytest.raises(ValueError):
        shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS, capture_global={"fs": {}})
    with pytest.raises(CaptureHookError):
        shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS, capture_consumers={"fs": "filesystem"},
                       capture_global={"fs": {"tag": "g", "hooks": {"post_mlp": [0]}, "positions": "all"}})
    shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS).close()


def test_filesystem_consumer_refusals(ns, secret, tmp_path):
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS, capture_consumers={"fs": "filesystem"}):
        with pytest.raises(UnknownConsumerError):
            FilesystemConsumer(ns, str(tmp_path), secret=secret, name="nobody")
        with pytest.raises(CaptureLayoutError):
            FilesystemConsumer(ns, str(tmp_path), secret=secret, layout="stacked")
        with pytest.raises(ValueError):
            FilesystemConsumer(ns, str(tmp_path), secret=secret, policy="wait")
        with FilesystemConsumer(ns, str(tmp_path), secret=secret) as fs:
            with pytest.raises(ConsumerTakenError):
                FilesystemConsumer(ns, str(tmp_path), secret=secret)
        assert fs.stop() == {"requests": 0, "ok": 0, "partial": 0, "failed": 0, "records": 0, "bytes": 0}


class Layer(torch.nn.Module):
    """Outputs the tensor the test queued for it."""

    def __init__(self) -> None:
        super().__init__()
        self.out = torch.zeros(0)

    def forward(self, x: Any) -> torch.Tensor:
        return self.out


def wait_result(o: shmsteer.Owner, rid: str) -> Dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        res = o.capture_result(rid)
        if all(r["status"] != "pending" for r in res.values()) or time.monotonic() > deadline:
            return res
        time.sleep(0.02)


@pytest.mark.parametrize("layout", ["per_file", "packed"])
def test_owner_capture_written_for_the_fork_reader(ns, secret, tmp_path, layout):
    """Two requests steered by +1 at every site, a prefill step then two decode steps: "cap"
    names the consumer (post_block at layers 0 and 2, every position, prompt 3), "g" names none
    and gets the global spec (the last prompt token at layer 1, prompt 2, under its own id).
    The fork's reader reads both; the rows are the ones the hooks saw before steering them."""
    gspec = {"tag": "glob", "hooks": {"post_block": [1]}, "positions": "last_prompt", "layout": layout}
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS, capture_consumers={"fs": "filesystem"},
                        capture_global={"fs": gspec}) as o, \
            FilesystemConsumer(ns, str(tmp_path), secret=secret, fsync=False) as fs:
        layers = [Layer() for _ in range(LAYERS)]
        hooks = SteeringHooks(o)
        for i, m in enumerate(layers):
            hooks.attach(m, "post_block", i)
        hooks.start_capture()
        steer = {"base": {"vectors": [{"hook": "post_block", "layer": i, "scale": 1.0, "data": [1.0] * HIDDEN}
                                      for i in range(LAYERS)]}}
        cap = {"fs": {"request_id": "cap", "tag": "t", "hooks": {"post_block": [0, 2]}, "positions": "all",
                      "layout": layout}}
        o.admit("cap", override=steer, capture=cap, prompt_len=3)
        o.admit("g", override=steer, prompt_len=2)
        gen = torch.Generator().manual_seed(5)
        seen: Dict[tuple, list] = {}
        # (cap rows, g rows, first positions): a prefill step, then two decode steps.
        for step, (nc, ng, pc, pg) in enumerate([(3, 2, 0, 0), (1, 1, 3, 2), (1, 1, 4, 3)]):
            phase = "prefill" if step == 0 else "decode"
            spans = [("cap", 0, nc, phase, pc), ("g", nc, nc + ng, phase, pg)]
            outs = [torch.randn(nc + ng, HIDDEN, generator=gen) for _ in range(LAYERS)]
            for i, m in enumerate(layers):
                m.out = outs[i].clone()
                for r in range(nc):
                    seen.setdefault(("cap", i), []).append(outs[i][r].numpy().copy())
                for r in range(ng):
                    seen.setdefault(("g", i), []).append(outs[i][nc + r].numpy().copy())
            with torch.inference_mode(), hooks.step(spans):
                for m in layers:
                    m(None)
            for i, m in enumerate(layers):  # steered after capture
                assert torch.allclose(m.out, outs[i] + 1.0)
        o.end("cap")
        o.end("g")
        rc, rg = wait_result(o, "cap"), wait_result(o, "g")
        hooks.close()
        stats = fs.stop()
    assert rc["fs"]["status"] == "ok", rc
    assert rg["fs"]["status"] == "ok" and rg["fs"].get("global") is True, rg
    assert stats["requests"] == 2 and stats["ok"] == 2, stats
    reader = fork_reader()
    got = reader.read_request(tmp_path / "t" / "cap")
    assert sorted(got) == [(0, "post_block"), (2, "post_block")]
    for layer in (0, 2):
        arr, dtype, pos = got[(layer, "post_block")]
        assert dtype == "float32" and pos == [0, 1, 2, 3, 4]
        np.testing.assert_array_equal(arr, np.stack(seen[("cap", layer)]))  # pre-steer, bitwise
    gdir = [p for p in (tmp_path / "glob").iterdir()]
    assert [p.name for p in gdir] == ["g"]
    gg = reader.read_request(gdir[0])
    arr, _, pos = gg[(1, "post_block")]
    assert pos == [1] and arr.shape == (1, HIDDEN)
    np.testing.assert_array_equal(arr[0], seen[("g", 1)][1])
    assert sorted(pathlib.Path(p).name for p in rc["fs"]["payload"]) == sorted(
        p.name for p in (tmp_path / "t" / "cap").iterdir())
