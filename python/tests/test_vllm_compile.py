"""The vLLM plugin's compiled sites below the engine: ``torch.compile(fullgraph=True)`` of a toy
model with vLLM's decoder-layer contract and the compiled LayerSites attached before the trace
(as the plugin attaches them at load time), bound to an apply after it: no graph break, the
eager results at every hook point, no recompile as the step's steering changes, nothing outside a
step or after removal; the worker's compile check. None of these needs vLLM
(test_vllm_compile_e2e.py runs vLLM's own torch.compile)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from shmsteer.vllm import CompiledModelError, CudaGraphModeError, SitesNotAttachedError
from shmsteer.vllm.layers import HOOK_POINTS, LayerSites
from shmsteer.vllm.worker import WorkerSteering, compile_mode

from test_vllm_plugin import HIDDEN, _Model, _reference

IDS = {h: i for i, h in enumerate(HOOK_POINTS)}


class _Adds:
    """An apply adding ``vec[(hook_id, layer)]`` (when set) to the site's tensor in place."""

    def __init__(self) -> None:
        self.vec: dict = {}
        self.calls = 0

    def __call__(self, t: torch.Tensor, hid: int, layer: int) -> None:
        self.calls += 1
        v = self.vec.get((hid, layer))
        if v is not None:
            t.add_(v)


def _compiled(n: int = 2):
    torch.manual_seed(0)
    m = _Model(n)
    sites = LayerSites(m, compiled=True)  # before the trace, unbound: vLLM's load time
    return m, sites


def test_compiled_sites_trace_without_graph_break():
    m, sites = _compiled()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(m)(torch.randn(3, HIDDEN))
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    ops = [str(n.target) for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert sum("vllm_site_" in o for o in ops) == len(HOOK_POINTS) * 2, ops
    sites.remove()


def test_compiled_sites_equal_eager_at_every_hook_point():
    """One compiled model, one step per (hook, layer): each equals the stream written out with
    the add at that point, none recompiles."""
    m, sites = _compiled()
    torch._dynamo.reset()
    x = torch.randn(3, HIDDEN)
    plain = _Model(2)(x.clone())
    compiled = torch.compile(m, fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x.clone()), plain)  # traced outside a step, unbound: nothing
        adds = _Adds()
        sites.bind(adds, IDS.get)
        assert sites.sites == {(h, i): IDS[h] for h in HOOK_POINTS for i in (0, 1)}
        for hook in HOOK_POINTS:
            for layer in (0, 1):
                add = torch.randn(HIDDEN)
                adds.vec = {(IDS[hook], layer): add}
                sites.active = True
                with torch._dynamo.config.patch(error_on_recompile=True):
                    got = compiled(x.clone())
                sites.active = False
                torch.testing.assert_close(got, _reference(hook, layer, x, add), msg=f"{hook} L{layer}")
                assert not got.equal(plain)
        calls = adds.calls
        assert calls == len(HOOK_POINTS) * 2 * len(HOOK_POINTS) * 2  # every site of every step
        assert torch.equal(compiled(x.clone()), plain)  # outside a step
        assert adds.calls == calls
    sites.remove()


def test_compiled_sites_bound_to_some_hooks_steer_only_those():
    m, sites = _compiled()
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True)
    x, add = torch.randn(3, HIDDEN), torch.randn(HIDDEN)
    adds = _Adds()
    adds.vec = {(IDS["mlp_out"], 1): add, (IDS["pre_attn"], 0): add}
    sites.bind(adds, IDS.get, hooks=["mlp_out"])
    sites.active = True
    with torch.no_grad():
        got = compiled(x.clone())
    torch.testing.assert_close(got, _reference("mlp_out", 1, x, add))
    sites.unbind()
    with torch.no_grad():
        assert torch.equal(compiled(x.clone()), _Model(2)(x.clone()))  # unbound: nothing, in a step
    sites.remove()


def test_removed_compiled_sites_steer_nothing():
    m, sites = _compiled()
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True)
    x = torch.randn(3, HIDDEN)
    adds = _Adds()
    adds.vec = {(IDS["post_block"], 0): torch.randn(HIDDEN)}
    sites.bind(adds, IDS.get)
    sites.active = True
    with torch.no_grad():
        assert not compiled(x.clone()).equal(_Model(2)(x.clone()))
        sites.remove()  # the graph keeps calling the operator; the token is gone
        assert torch.equal(compiled(x.clone()), _Model(2)(x.clone()))
    assert adds.calls == len(HOOK_POINTS) * 2


def _config(mode: int, cudagraph: str) -> SimpleNamespace:
    cc = SimpleNamespace(mode=mode, cudagraph_mode=SimpleNamespace(name=cudagraph))
    return SimpleNamespace(compilation_config=cc)


def test_compile_mode_and_graph_replay_refused(monkeypatch):
    """CUDA graphs without static mode (SHMSTEER_VLLM_STATIC=0; test_vllm_static.py: with it)."""
    monkeypatch.setenv("SHMSTEER_VLLM_STATIC", "0")
    assert compile_mode(_config(0, "NONE")) is False
    assert compile_mode(_config(2, "NONE")) is True
    assert compile_mode(_config(3, "NONE")) is True
    with pytest.raises(CudaGraphModeError, match="cudagraph mode PIECEWISE"):
        compile_mode(_config(3, "PIECEWISE"))
    with pytest.raises(CudaGraphModeError, match="cudagraph mode FULL"):
        compile_mode(_config(0, "FULL"))
    assert issubclass(CudaGraphModeError, CompiledModelError) and issubclass(SitesNotAttachedError, CompiledModelError)


def test_compiled_worker_needs_sites_attached_at_load():
    m = _Model(1)
    with pytest.raises(SitesNotAttachedError, match="no compiled sites"):
        WorkerSteering(m, _config(2, "NONE"))
    with pytest.raises(SitesNotAttachedError, match="no compiled sites"):
        WorkerSteering(m, _config(2, "NONE"), sites=LayerSites(m, _Adds(), IDS.get))  # eager sites
    sites = LayerSites(m, compiled=True)
    st = WorkerSteering(m, _config(2, "NONE"), sites=sites)
    assert st.compiled and st.sites is sites
    sites.remove()
