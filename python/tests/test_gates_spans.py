"""A request owning several rows of one decode step in several spans (multi-token decode) with
a this_token probe gate: the native path (the Go Stepper) and the device paths gate each row by
its own probe read (issue 41, item 9: natively the firing row got nothing)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch not importable (apt-get install python3-torch)")

from test_device_gates import ADD, MIXED, PROBE, _hooks, _input, _run, owner  # noqa: E402,F401


@pytest.mark.parametrize("path", ["native", "device", "static"])
def test_this_token_per_row_across_spans(owner, path):  # noqa: F811 - the fixture
    owner.admit("r", steering=[{"when": PROBE, "scope": "this_token", "apply": {**ADD, "strength": 3}}])
    two = [("r", 0, 1, "decode"), ("r", 1, 2, "decode")]
    one = [("r", 0, 2, "decode")]
    x = _input(MIXED, torch.float32)
    h, chain = _hooks(owner, path, torch.float32, 2)
    got = _run(h, chain, x, two)
    # The probe reads at layer 1: the firing row gets 3 at layers 1 and 2, the quiet row nothing.
    assert got[0, 1].item() == pytest.approx(6.0, abs=1e-5), (path, got)
    assert abs(got[1, 1].item()) < 1e-5, (path, got)
    torch.testing.assert_close(got, _run(h, chain, x, one), rtol=0, atol=1e-5, msg=f"{path}: as one span")
    sums = set()
    for p in ("native", "device"):
        hp, cp = _hooks(owner, p, torch.float32, 2)
        torch.testing.assert_close(_run(hp, cp, x, two), got, rtol=0, atol=1e-5, msg=f"{p} against {path}")
        sums.add(hp.stepper.stats()["gate_checksum"])
    assert len(sums) == 1, "the same decisions on both paths"
