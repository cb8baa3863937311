"""The native path on bfloat16 tensors: the library widens, steers and narrows the rows in one
call (shmsteer_stepper_apply_bf16). It must give, bit for bit, what the float32 route gives:
each site's rows widened with .float(), steered by a Stepper's apply, and narrowed with torch's
conversion (round to nearest even), with the same checksum; rows outside every span untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import shmsteer
from shmsteer.torch_hook import SteeringHooks
from steering_ref import HIDDEN, HOOKS, LAYERS, Chain, Scenario, attach

# Steps of a batch that grows and shrinks: (request, first row, end row, phase, first position).
STEPS = [
    [("a", 0, 3, "prefill", 0), ("b", 3, 4, "decode", 5)],
    [("a", 0, 1, "decode", 3), ("b", 1, 3, "decode", 6), ("c", 3, 7, "prefill", 0), ("d", 8, 9, "decode", 2)],
    [("c", 0, 1, "decode", 4), ("d", 2, 3, "decode", 3)],
]


def _route_f32(o: shmsteer.Owner, x: torch.Tensor, spans, version: int) -> tuple[torch.Tensor, int]:
    """The float32 route, site by site in the chain's order."""
    st = o.stepper()
    try:
        st.begin(version)
        t = x.clone()
        for layer in range(LAYERS):
            for hook in HOOKS:
                t32 = t.float()
                st.apply(hook, layer, t32, spans)
                t = t32.to(torch.bfloat16)
        return t, st.end()
    finally:
        st.close()


def test_native_bf16_equals_the_float32_route(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS, hooks=list(HOOKS)) as o:
        sc = Scenario(o, seed=11)  # named vectors, global tiers with clamps, requests a..d
        chain = Chain()
        hooks = SteeringHooks(o)
        attach(hooks, chain)
        assert hooks.mode == "native"
        gen = torch.Generator().manual_seed(3)
        version = o.version
        for i, spans in enumerate(STEPS):
            rows = max(s[2] for s in spans) + 1  # one row past every span
            x = (torch.randn(rows, HIDDEN, generator=gen) * 2).to(torch.bfloat16)
            x[rows - 1, 0] = float("nan")
            want, want_sum = _route_f32(o, x, spans, version)
            got = x.clone()
            with torch.inference_mode(), hooks.step(spans, version=version):
                chain(got)
            covered = np.zeros(rows, bool)
            for _, a, b, _, _ in spans:
                covered[a:b] = True
            bits = lambda t: t.view(torch.int16).numpy()  # noqa: E731
            assert np.array_equal(bits(got)[covered], bits(want)[covered]), f"step {i}: steered rows differ"
            assert np.array_equal(bits(got)[~covered], bits(x)[~covered]), f"step {i}: rows in no span changed"
            assert not torch.equal(got[covered], x[covered]), f"step {i}: nothing was steered"
            assert hooks.checksum == want_sum, f"step {i}: checksum"
        hooks.close()


def test_native_bf16_refuses_a_partial_row(ns, secret):
    """The library's own check: a bfloat16 block that is not whole rows is ShapeError, unchanged."""
    from shmsteer._lib import lib
    from shmsteer.errors import ShapeError
    from shmsteer._lib import check
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS, hooks=list(HOOKS)) as o:
        Scenario(o, seed=2)
        st = o.stepper()
        st.begin()
        t = torch.randn(2, HIDDEN).to(torch.bfloat16)
        t0 = t.clone()
        spans = st.spans([("a", 0, 1, "decode", 0)])
        with pytest.raises(ShapeError):
            check(lib.shmsteer_stepper_apply_bf16(st.handle, 0, 0, t.data_ptr(), HIDDEN + 3, spans, len(spans)))
        assert torch.equal(t.view(torch.int16), t0.view(torch.int16))
        st.end()
        st.close()
