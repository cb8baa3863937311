"""torch.compile of a model with the hooks attached (static mode, the compile mode): no graph
break, the eager results step after step as the batch's steering changes, no recompile per step;
the operators' fake kernels; the minimum torch refused with a typed error."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not importable")

import shmsteer  # noqa: E402
from shmsteer import ops  # noqa: E402,F401  (registers torch.ops.shmsteer)
from shmsteer._torchreq import MIN_TORCH, TorchVersionError, require_torch, torch_version  # noqa: E402
from shmsteer.torch_hook import SteeringHooks, StaticHooks  # noqa: E402

from steering_ref import HIDDEN, HOOKS, LAYERS, Scenario  # noqa: E402

T = 8  # the padded batch's rows (static mode's max_tokens)


class Block(torch.nn.Module):
    """A residual block: pre_attn is the normed input, post_block the block's output."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(HIDDEN, 2 * HIDDEN), torch.nn.GELU(), torch.nn.Linear(2 * HIDDEN, HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Decoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = torch.nn.Linear(HIDDEN, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _attach(h: SteeringHooks, m: Decoder) -> None:
    for i, b in enumerate(m.blocks):
        h.attach(b.norm, "pre_attn", i)
        h.attach(b, "post_block", i)


@pytest.fixture
def owner(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS, hooks=list(HOOKS)) as o:
        o.register_vector("p", [("post_block", 1, 1.0, np.eye(HIDDEN, dtype=np.float32)[0])], kind="probe")
        o.register_vector("s", [("post_block", l, 1.0, np.eye(HIDDEN, dtype=np.float32)[1]) for l in range(LAYERS)])
        yield o


def _steps(sc: Scenario, o: shmsteer.Owner):
    """Six steps of a padded batch whose spans, vectors and gates change from step to step."""
    rng = np.random.default_rng(3)
    steps = [[("a", 0, 3, "prefill"), ("b", 3, 4, "decode")],
             [("a", 0, 1, "decode"), ("b", 1, 2, "decode"), ("c", 2, 6, "prefill")],
             [("b", 0, 2, "decode"), ("c", 2, 3, "decode"), ("d", 3, 4, "decode")],
             [("c", 0, 1, "decode"), ("g", 1, 3, "decode")],
             [("g", 0, 1, "decode"), ("d", 1, 8, "prefill")],
             [("d", 0, 1, "decode")]]
    for i, spans in enumerate(steps):
        if i == 2:
            sc.register("n0", [("post_block", l, 1.0, rng.standard_normal(HIDDEN).astype(np.float32)) for l in range(LAYERS)])
        if i == 3:
            sc.end("a")
            probe = {"kind": "probe", "probe": {"kind": "name", "name": "p"}, "threshold": 0.0, "sharpness": 10}
            o.admit("g", override={"decode": {"refs": [{"name": "n1", "strength": 1.0}]}},
                    steering=[{"when": probe, "scope": "this_token",
                               "apply": {"kind": "add", "steer": {"kind": "name", "name": "s"}, "strength": 2}}])
        yield spans


@pytest.mark.parametrize("addends", [False, True], ids=["gather", "addends"])
def test_compiled_hooks_no_graph_break_equal_eager_no_recompile(owner, addends):
    """addends: the compiled hooks without clamps (each site adds the rows prepare gathered)
    against eager hooks that gather at each site, over a scenario without clamps."""
    sc = Scenario(owner, seed=2, clamps=not addends)
    eager_m, comp_m, plain_m = Decoder(), Decoder(), Decoder()
    kw = dict(static=True, max_tokens=T, device="cpu", dtype=torch.float32, max_row_gates=1)
    he, hc = SteeringHooks(owner, **kw), SteeringHooks(owner, **kw, **({"max_clamps": 0} if addends else {}))
    assert isinstance(hc, StaticHooks)
    _attach(he, eager_m)
    _attach(hc, comp_m)
    assert bool(hc._addends) == addends and not he._addends
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(T, HIDDEN, generator=gen)
    hc.prepare([("a", 0, 3, "prefill"), ("b", 3, 4, "decode")])
    with torch.no_grad():
        explained = torch._dynamo.explain(comp_m)(x0.clone())
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    hc.report()
    torch._dynamo.reset()
    compiled = torch.compile(comp_m, fullgraph=True)
    first = True
    for i, spans in enumerate(_steps(sc, owner)):
        x = torch.randn(T, HIDDEN, generator=gen)
        he.prepare(spans)
        hc.prepare(spans)
        with torch.no_grad():
            want = eager_m(x.clone())
            if first:
                got = compiled(x.clone())
                first = False
            else:
                with torch._dynamo.config.patch(error_on_recompile=True):  # a recompile raises
                    got = compiled(x.clone())
            plain = plain_m(x.clone())
        he.report()
        hc.report()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"step {i}")
        assert not torch.allclose(want, plain, atol=1e-3), f"step {i}: nothing steered"
        assert hc.batch_checksum == he.batch_checksum
    assert hc.stepper.stats()["gate_checksum"] == he.stepper.stats()["gate_checksum"]
    assert he.stepper.stats()["gate_evaluations"] > 0


def test_compiled_static_sites_trace_aten_ops_not_the_operator(owner):
    """Compiled, static mode's gather-add is traced as aten ops (fused by the compiler), not a
    call of the opaque shmsteer::steer_ (a Python round trip at every site); same results."""
    Scenario(owner, seed=2, clamps=False)
    targets = []

    def backend(gm, _inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method"))
        return gm.forward

    kw = dict(static=True, max_tokens=T, device="cpu", dtype=torch.float32, max_clamps=0)
    he, hc = SteeringHooks(owner, **kw), SteeringHooks(owner, **kw)
    eager_m, comp_m = Decoder(), Decoder()
    _attach(he, eager_m)
    _attach(hc, comp_m)
    spans = [("a", 0, 3, "prefill"), ("b", 3, 4, "decode")]
    x = torch.randn(T, HIDDEN, generator=torch.Generator().manual_seed(5))
    he.prepare(spans)
    hc.prepare(spans)
    torch._dynamo.reset()
    with torch.no_grad():
        want = eager_m(x.clone())
        got = torch.compile(comp_m, backend=backend, fullgraph=True)(x.clone())
        plain = Decoder()(x.clone())
    he.report()
    hc.report()
    assert targets and not [t for t in targets if "shmsteer" in t], targets
    assert "add_" in targets
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(want, plain, atol=1e-3)
    he.close()
    hc.close()


@pytest.mark.parametrize("static", [True, False], ids=["static", "device"])
def test_compiled_bf16_add_after_a_matmul_is_not_an_addmm(ns, secret, static):
    """A steered site on a bias-free Linear's output, in bf16, compiled by inductor: the add is
    not folded into an addmm (slower than the mm and a fused add on a CPU), and the result is
    the eager hooks' to the bit (the add computed in float32 and rounded once, as add_)."""
    from torch._inductor.utils import run_and_get_code
    rng = np.random.default_rng(4)
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=1, hooks=["mlp_out"]) as o:
        o.admit("a", override={"decode": {"vectors": [{"hook": "mlp_out", "layer": 0, "scale": 1.0,
                                                       "data": rng.standard_normal(HIDDEN).tolist()}]}})
        torch.manual_seed(0)
        lin = torch.nn.Linear(HIDDEN, HIDDEN, bias=False).to(torch.bfloat16)
        kw = dict(static=True, max_tokens=T, device="cpu", dtype=torch.bfloat16, max_clamps=0) if static else \
            dict(force_device_path=True)
        h = SteeringHooks(o, **kw)
        h.attach(lin, "mlp_out", 0)
        x = torch.randn(T, HIDDEN, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
        spans = [("a", 0, T, "decode")]
        torch._dynamo.reset()
        compiled = torch.compile(lin, fullgraph=static)

        def run(f):
            with torch.no_grad():
                if static:
                    h.prepare(spans)
                    y = f(x)
                    h.report()
                    return y
                with h.step(spans):
                    return f(x)

        want = run(lin)
        got, code = run_and_get_code(run, compiled)
        h.close()
    assert not torch.equal(want, x @ lin.weight.t())  # steered
    assert torch.equal(got, want)
    assert code and not any("addmm" in c for c in code), [c for c in code if "addmm" in c][0][:2000]


def test_sites_attached_after_compiling_are_traced_and_removed(owner):
    """Sites wrap the module's forward (not module hooks, which dynamo does not guard by
    default): a model compiled before attaching recompiles and steers as the eager hooks do, and
    after remove() runs its unsteered graph again; no dynamo setting needed."""
    assert torch._dynamo.config.skip_nnmodule_hook_guards  # the default: hooks are not guarded
    Scenario(owner, seed=2, clamps=False)
    comp_m, eager_m = Decoder(), Decoder()
    x = torch.randn(T, HIDDEN, generator=torch.Generator().manual_seed(7))
    torch._dynamo.reset()
    compiled = torch.compile(comp_m, fullgraph=True)
    kw = dict(static=True, max_tokens=T, device="cpu", dtype=torch.float32, max_clamps=0)
    hc, he = SteeringHooks(owner, **kw), SteeringHooks(owner, **kw)
    spans = [("a", 0, 3, "prefill"), ("b", 3, 4, "decode")]
    with torch.no_grad():
        plain = compiled(x.clone())
        _attach(hc, comp_m)
        _attach(he, eager_m)
        hc.prepare(spans)
        he.prepare(spans)
        got, want = compiled(x.clone()), eager_m(x.clone())
        hc.report()
        he.report()
        hc.remove()
        again = compiled(x.clone())
    assert not torch.allclose(got, plain, atol=1e-3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, plain, rtol=0, atol=0)
    hc.close()
    he.close()


def test_ops_pass_opcheck():
    """torch.library.opcheck of each operator (schema and mutations, fake kernel, AOT dispatch)
    on small inputs, the scratch-free (eager) and the scratch (static) forms; run through
    torch.ops each gives its kernel's result."""
    g = torch.Generator().manual_seed(0)
    H, S, K, G, n = 8, 4, 2, 2, 5
    h = torch.randn(n, H, generator=g)
    table = torch.randn(S, H, generator=g)
    idx = torch.tensor([0, 2, 1, 3, 2])
    dirs = torch.nn.functional.normalize(torch.randn(S, K, H, generator=g), dim=-1)
    params = torch.tensor([[-0.1, 0.1, 1.0]]).repeat(S, K, 1)
    steer_scratch = [torch.zeros(n, H), torch.zeros(n, K, H), torch.zeros(n, K, 3), torch.zeros(n, H),
                     torch.zeros(n, H), torch.zeros(2, n)]
    slots = torch.tensor([[1, 0, 2, 1, 0], [0, 3, 0, 0, 1]])
    sites = torch.tensor([[5, -1, 5, 5, -1], [-1, 6, -1, -1, 5]])
    gparams = torch.rand(3, G, n, generator=g)
    site = torch.tensor(5)
    gate, score = torch.zeros(G, n), torch.zeros(G, n)
    probe_scratch = [torch.zeros(n, H), torch.zeros(n, H), torch.zeros(n), torch.zeros(n), torch.zeros(n, dtype=torch.bool)]
    cases = [
        (torch.ops.shmsteer.steer_.default, (h.clone(), table, idx, None, None, None, 0, [])),
        (torch.ops.shmsteer.steer_.default, (h.clone(), table, idx[1:], idx[:4], dirs, params, K, [])),
        (torch.ops.shmsteer.steer_.default, (h.clone(), table, idx, None, dirs, params, K, steer_scratch)),
        (torch.ops.shmsteer.gate_probe_.default, (h, table, slots, sites, site, gparams, gate, score, [])),
        (torch.ops.shmsteer.gate_probe_.default, (h, table, slots, sites, site, gparams, gate, score, probe_scratch)),
        (torch.ops.shmsteer.gate_add_.default, (h.clone(), table, slots, gate.uniform_(generator=g), [])),
        (torch.ops.shmsteer.capture_.default, (h, idx[:2], torch.tensor([4, 5]), torch.zeros(6, H), [torch.zeros(n, H)])),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)
    x = h.clone()
    torch.ops.shmsteer.steer_(x, table, idx, None, None, None, 0, [])
    torch.testing.assert_close(x, h + table[idx], rtol=0, atol=0)
    buf = torch.zeros(6, H)
    torch.ops.shmsteer.capture_(h, idx[:2], torch.tensor([4, 5]), buf, [])
    torch.testing.assert_close(buf[4:], h[idx[:2]], rtol=0, atol=0)


def test_min_torch_refused_with_a_typed_error():
    assert MIN_TORCH == (2, 4)
    assert torch_version("2.13.0+cu128") == (2, 13) and torch_version("2.4.0a0+git") == (2, 4)
    require_torch("2.4.0")
    require_torch(torch.__version__)
    with pytest.raises(TorchVersionError, match=r"torch >= 2\.4"):
        require_torch("1.13.1")
    with pytest.raises(TorchVersionError):
        require_torch("nightly")
    assert issubclass(TorchVersionError, ImportError) and issubclass(TorchVersionError, shmsteer.ShmsteerError)
    # Importing the hooks under an older torch fails at import, with the typed error.
    code = ("import torch; torch.__version__ = '2.3.1'\n"
            "try:\n    import shmsteer.torch_hook\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("TorchVersionError"), out.stdout + out.stderr
    assert "2.3.1" in out.stdout
