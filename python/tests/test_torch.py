"""The torch forward hooks on a tiny model (4 layers, hidden 64), against the Go Stepper's output
for the same spans and steering."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not importable (apt-get install python3-torch)")

import shmsteer  # noqa: E402
from shmsteer.torch_hook import SteeringHooks  # noqa: E402

HIDDEN, LAYERS = 64, 4


@pytest.fixture
def steered(ns, secret):
    rng = np.random.default_rng(7)
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
        o.register_vector("honesty", [("post_block", i, 1.0, rng.standard_normal(HIDDEN).astype(np.float32))
                                      for i in range(LAYERS)])
        o.set_global({"base": {"vectors": [{"hook": "post_block", "layer": 2, "scale": 0.5,
                                            "data": rng.standard_normal(HIDDEN).tolist()}]}})
        o.admit("r1", override={"decode": {"refs": [{"name": "honesty", "strength": 2.0}]}})
        o.admit("r2", override={"base": {"vectors": [{"hook": "post_block", "layer": 0, "scale": 1.0,
                                                       "data": rng.standard_normal(HIDDEN).tolist()}]}})
        with shmsteer.Client(ns, secret=secret) as c:
            yield o, c


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(LAYERS)])


SPANS = [("r1", 0, 3, "decode"), ("r2", 3, 5, "prefill"), ("r3", 5, 6, "decode")]


def go_reference(c, m, x):
    """Layer by layer, the Go Stepper applied to a numpy copy of each layer's output."""
    st = c.stepper()
    st.begin()
    h = x.clone()
    with torch.no_grad():
        for i, layer in enumerate(m):
            h = layer(h)
            a = h.numpy().copy()
            st.apply("post_block", i, a, SPANS)
            h = torch.from_numpy(a)
    st.end()
    st.close()
    return h


def unsteered(m, x):
    with torch.no_grad():
        return m(x)


@pytest.mark.parametrize("device_path", [False, True], ids=["cpu-native", "device-path-on-cpu"])
def test_hook_matches_go_stepper(steered, device_path):
    _, c = steered
    m = model()
    x = torch.randn(6, HIDDEN)
    want = go_reference(c, m, x)
    assert not torch.allclose(want, unsteered(m, x)), "the steering must change something"
    hooks = SteeringHooks(c, force_device_path=device_path)
    for i, layer in enumerate(m):
        hooks.attach(layer, "post_block", i)
    with torch.no_grad(), hooks.step(SPANS):
        got = m(x)
    if device_path:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    else:
        assert torch.equal(got, want)
        assert hooks.checksum != 0
    hooks.remove()
    assert torch.equal(unsteered(m, x), m(x).detach())


def test_cpu_hook_steers_the_tensor_in_place_and_matches_numpy(steered):
    o, c = steered
    hooks = SteeringHooks(c)
    lin = torch.nn.Identity()
    hooks.attach(lin, "post_block", 1)
    x = torch.zeros(4, HIDDEN)
    ptr = x.data_ptr()
    with torch.no_grad(), hooks.step([("r1", 0, 2, "decode"), ("r1", 2, 4, "prefill")]):
        y = lin(x)
    assert y.data_ptr() == ptr  # steered where it lies
    with c.snapshot() as s:
        v = s.vector("honesty").entries[1].data
        np.testing.assert_allclose(y[:2].numpy(), np.broadcast_to(2.0 * v, (2, HIDDEN)), rtol=1e-6)
        del v
    assert torch.equal(y[2:], torch.zeros(2, HIDDEN))  # r1 steers decode rows only


def test_device_path_uploads_only_on_change(steered):
    o, c = steered
    hooks = SteeringHooks(c, force_device_path=True)
    lin = torch.nn.Identity()
    hooks.attach(lin, "post_block", 1)

    def run():
        x = torch.zeros(2, HIDDEN)
        with torch.no_grad(), hooks.step([("r1", 0, 2, "decode")]):
            lin(x)
        return x

    first = run()
    assert hooks.uploads == 1
    run()
    run()
    assert hooks.uploads == 1, "unchanged steering is not uploaded again"
    o.register_vector("honesty", [("post_block", 1, 1.0, np.ones(HIDDEN, np.float32))])
    second = run()
    assert hooks.uploads == 2
    assert torch.equal(second, torch.full((2, HIDDEN), 2.0))
    assert not torch.equal(first, second)


def test_device_path_applies_clamps_as_the_cpu_path(steered):
    o, c = steered
    o.admit("rc", override={"base": {"clamps": [{"hook": "post_block", "layer": 1,
                                                  "dir": [1.0] + [0.0] * (HIDDEN - 1),
                                                  "min": 0.0, "max": 0.0, "strength": 1.0}]}})
    outs = []
    for device_path in (True, False):
        hooks = SteeringHooks(c, force_device_path=device_path)
        lin = torch.nn.Identity()
        hooks.attach(lin, "post_block", 1)
        x = torch.ones(1, HIDDEN)
        with torch.no_grad(), hooks.step([("rc", 0, 1, "decode")]):
            lin(x)
        hooks.close()
        assert x[0, 0].item() == pytest.approx(0.0, abs=1e-6)  # an ablation of the first coordinate
        outs.append(x)
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_path_matches_go_stepper(steered):
    _, c = steered
    m = model()
    x = torch.randn(6, HIDDEN)
    want = go_reference(c, m, x)
    mc = m.cuda()
    hooks = SteeringHooks(c, device="cuda")
    for i, layer in enumerate(mc):
        hooks.attach(layer, "post_block", i)
    with torch.no_grad(), hooks.step(SPANS):
        got = mc(x.cuda()).cpu()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("device_path", [False, True], ids=["cpu-native", "device-path-on-cpu"])
def test_attach_wraps_forward_in_order_and_remove_restores_it(steered, device_path):
    """attach makes the module's forward call the sites after it (no forward hook: torch's hook
    dispatch costs the call more than the wrapper); a forward hook on the module sees the steered
    output; two hooks objects' sites on one module run in attach order; removing every site
    restores the forward the module had, class or instance attribute; a deep copy of an attached
    model computes with its own weights."""
    import copy
    _, c = steered
    m = model()
    x = torch.randn(6, HIDDEN)
    want = go_reference(c, m, x)
    a = SteeringHooks(c, force_device_path=device_path)
    b = SteeringHooks(c, force_device_path=device_path)
    own = m[3].forward
    lam = m[3].forward = lambda t, f=own: f(t)  # an instance forward set before attaching
    seen = []
    m[1].register_forward_hook(lambda _m, _i, out: seen.append(out.clone()))
    handles = {}
    for i, layer in enumerate(m):
        handles[i] = (a if i % 2 else b).attach(layer, "post_block", i)
        assert not layer._forward_hooks or i == 1
    twin = copy.deepcopy(m)
    with torch.no_grad():
        twin[0].weight.mul_(2)
    with torch.no_grad(), a.step(SPANS), b.step(SPANS):
        got = m(x)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    # The hook on layer 1 saw layer 1's steered output: one more steered pass through 0 and 1.
    with torch.no_grad(), a.step(SPANS), b.step(SPANS):
        h1 = m[1](m[0](x))
    assert torch.equal(seen[-1], h1)
    with torch.no_grad(), a.step(SPANS), b.step(SPANS):
        other = twin(x)
    assert not torch.allclose(other, got)  # the copy's own layer 0
    # The second hooks' site on layer 0 runs after the first's: both add, in attach order.
    extra = a.attach(m[0], "post_block", 0)
    assert m[0].__dict__["_shmsteer_sites"][0][1] is extra._fn
    extra.remove()
    a.remove()
    b.remove()
    assert "forward" not in m[0].__dict__ and "_shmsteer_sites" not in m[0].__dict__
    assert m[3].__dict__["forward"] is lam
    assert torch.equal(unsteered(m, x), m(x).detach())
    handles[0].remove()  # idempotent


@pytest.mark.parametrize("device_path", [False, True], ids=["cpu-native", "device-path-on-cpu"])
def test_attach_input_steers_the_first_input_before_the_forward(steered, device_path):
    """attach(..., input=True) steers the module's first input in place before its forward
    (positional or keyword), as a site on an identity's output would; remove() detaches it."""
    _, c = steered
    lin = model()[0]
    x = torch.randn(6, HIDDEN)
    ident = torch.nn.Identity()
    ref = SteeringHooks(c, force_device_path=device_path)
    ref.attach(ident, "post_block", 0)
    with torch.no_grad(), ref.step(SPANS):
        want_in = ident(x.clone())
    h = SteeringHooks(c, force_device_path=device_path)
    r = h.attach(lin, "post_block", 0, input=True)
    for call in (lambda t: lin(t), lambda t: lin(input=t)):
        xi = x.clone()
        with torch.no_grad(), h.step(SPANS):
            got = call(xi)
        assert torch.equal(xi, want_in)  # steered in place
        assert torch.equal(got, torch.nn.functional.linear(want_in, lin.weight, lin.bias))
    r.remove()
    assert "forward" not in lin.__dict__
    with torch.no_grad():
        assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias))
