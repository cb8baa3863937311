"""Static hooks built on a layout before any owner exists (what the vLLM plugin does at load time,
before its graphs are captured), bound to an owner later and again after a restart: the same
results as the eager device path, the buffers never reallocated; a mismatched owner, a step
before bind and capture after seal are typed errors."""

from __future__ import annotations

from typing import Any, List, Tuple

import pytest

torch = pytest.importorskip("torch", reason="torch not importable (apt-get install python3-torch)")

import shmsteer  # noqa: E402
from shmsteer import capture  # noqa: E402
from shmsteer.torch_hook import (LAYOUT_HOOKS, NotBoundError, StaticCaptureError, StaticLayout,  # noqa: E402
                                 StaticLayoutError, SteeringHooks)

HIDDEN, LAYERS, MAX_TOKENS = 32, 2, 8
SITES = [("pre_attn", 1), ("post_block", 0), ("mlp_out", 1)]
SPANS = [("a", 0, 3, "prefill"), ("b", 3, 4, "decode"), ("u", 4, 6, "prefill")]  # rows 6, 7: padding


def layout_hooks(**kw: Any) -> Any:
    h = SteeringHooks(StaticLayout(HIDDEN, LAYERS), static=True, max_tokens=MAX_TOKENS, device="cpu",
                      dtype=torch.float32, max_slots=8, **kw)
    for hook, layer in SITES:
        h.register(hook, layer)
    return h


def admit(o: Any, scale: float) -> None:
    def vecs(seed: int) -> List[dict]:
        g = torch.Generator().manual_seed(seed)
        return [{"hook": hk, "layer": ly, "scale": scale, "data": torch.randn(HIDDEN, generator=g).tolist()}
                for hk, ly in SITES]
    o.admit("a", override={"base": {"vectors": vecs(1)}})
    o.admit("b", override={"base": {"vectors": vecs(2)}})


def forward(hooks: Any, x: torch.Tensor, ids: List[Tuple[int, int]]) -> torch.Tensor:
    y = x.clone()
    for hid, layer in ids:
        hooks.apply(y, hid, layer)
    return y


def reference(o: Any, x: torch.Tensor) -> torch.Tensor:
    eager = SteeringHooks(o, force_device_path=True)
    ids = [(o.hook_id(h), ly) for h, ly in SITES]
    try:
        with eager.step(SPANS, rows=MAX_TOKENS):
            return forward(eager, x, ids)
    finally:
        eager.close()


def test_layout_hooks_bind_to_an_owner_and_again_after_a_restart(ns, secret):
    hooks = layout_hooks()
    ids = [(LAYOUT_HOOKS.index(h), ly) for h, ly in SITES]
    x = torch.randn(MAX_TOKENS, HIDDEN, generator=torch.Generator().manual_seed(5))
    assert not hooks.bound
    assert torch.equal(forward(hooks, x, ids), x), "unbound: every row gathers row 0 (zeros)"
    with pytest.raises(NotBoundError, match="bind"):
        hooks.prepare(SPANS)
    with pytest.raises(NotBoundError, match="bind"):
        hooks.start_capture()
    buffers = [hooks._sidx.data_ptr()] + [hooks._tables.sites[s].vec.data_ptr() for s in sorted(hooks._tables.sites)]
    for gen, scale in enumerate((1.0, -2.0)):  # an owner, then a restarted one with other vectors
        with shmsteer.Owner(f"{ns}-{gen}", secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
            admit(o, scale)
            hooks.bind(o)
            assert hooks.bound
            hooks.prepare(SPANS)
            got = forward(hooks, x, ids)
            hooks.report()
            want = reference(o, x)
            assert torch.allclose(got, want, atol=1e-5), f"owner {gen}"
            assert not torch.equal(got, x) and torch.equal(got[4:], x[4:]), "steered rows only"
    after = [hooks._sidx.data_ptr()] + [hooks._tables.sites[s].vec.data_ptr() for s in sorted(hooks._tables.sites)]
    assert after == buffers, "bind keeps every buffer (a captured graph reads them)"
    hooks.close()


def test_bind_refuses_another_layout_and_changes_nothing(ns, secret):
    hooks = layout_hooks()
    with shmsteer.Owner(ns + "-w", secret=secret, hidden=HIDDEN * 2, layers=LAYERS) as o:
        with pytest.raises(StaticLayoutError, match="hidden"):
            hooks.bind(o)
    with shmsteer.Owner(ns + "-h", secret=secret, hidden=HIDDEN, layers=LAYERS,
                        hooks=["post_block", "pre_attn", "mlp_out"]) as o:
        with pytest.raises(StaticLayoutError, match="hook order"):
            hooks.bind(o)
    with shmsteer.Owner(ns + "-m", secret=secret, hidden=HIDDEN, layers=LAYERS, hooks=["pre_attn"]) as o:
        with pytest.raises(StaticLayoutError, match="no hook"):
            hooks.bind(o)
    assert not hooks.bound
    with pytest.raises(NotBoundError):
        hooks.prepare(SPANS)
    assert isinstance(StaticLayoutError("x"), shmsteer.errors.ShmsteerError)


def test_sealed_hooks_refuse_new_buffers(ns, secret):
    hooks = layout_hooks()
    hooks.seal()
    with pytest.raises(RuntimeError, match="sealed"):
        hooks.register("post_attn", 0)
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
        capture.serve_capture(o, {"py": "filesystem"})
        hooks.bind(o)
        with pytest.raises(StaticCaptureError, match="capture_buffers"):
            hooks.start_capture()
        assert not hooks._capturing
        hooks.prepare(SPANS)  # steering goes on without capture
        hooks.report()
        with_buffers = layout_hooks()
        with_buffers.capture_buffers()
        with_buffers.seal()
        with_buffers.bind(o)
        with_buffers.start_capture()
        assert with_buffers._capturing and with_buffers._scap is not None
        with_buffers.close()
    hooks.close()
