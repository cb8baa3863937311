"""The vLLM plugin's static mode below the engine (no vLLM): when it is on, how its buffers are
sized, the hooks built at load before any owner, and a worker stepping through prepare/report
on a toy model of vLLM's layer contract, eagerly and under ``torch.compile(fullgraph=True)``:
the same streams as the eager plugin, on one owner and after a restart. test_vllm_static_e2e.py
runs it in vLLM (CPU backend)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, List

import pytest
import torch

import shmsteer
from shmsteer.torch_hook import StaticHooks, StaticLayoutError
from shmsteer.vllm import CudaGraphModeError, PluginConfigError, SitesNotAttachedError
from shmsteer.vllm import static as vstatic
from shmsteer.vllm.worker import WorkerSteering, compile_mode

from test_vllm_plugin import HIDDEN, _Model

LAYERS = 2
SPANS = [("a", 0, 2, "prefill", 0), ("b", 2, 3, "decode", 5), ("u", 3, 4, "prefill", 0)]  # rows 4, 5: padding


def config(mode: int = 0, cudagraph: str = "NONE", tokens: int = 6, sizes: Any = None) -> SimpleNamespace:
    cc = SimpleNamespace(mode=mode, cudagraph_mode=SimpleNamespace(name=cudagraph), cudagraph_capture_sizes=sizes,
                         max_cudagraph_capture_size=max(sizes) if sizes else None)
    hf = SimpleNamespace(hidden_size=HIDDEN, num_hidden_layers=LAYERS)
    return SimpleNamespace(compilation_config=cc, scheduler_config=SimpleNamespace(max_num_batched_tokens=tokens),
                           model_config=SimpleNamespace(hf_text_config=hf, dtype=torch.float32),
                           parallel_config=SimpleNamespace(data_parallel_rank=0, data_parallel_size=1))


class _Follower:
    """Follower.current() over an owner the test swaps (a restart: the generation goes up)."""

    def __init__(self, owner: Any) -> None:
        self.owner, self.gen = owner, 0

    def current(self) -> Any:
        return self.owner, self.gen, False


def test_static_mode_settings(monkeypatch):
    monkeypatch.delenv("SHMSTEER_VLLM_STATIC", raising=False)
    assert not vstatic.static_mode(config(3, "NONE"))
    assert vstatic.static_mode(config(3, "PIECEWISE")) and vstatic.static_mode(config(0, "FULL"))
    assert compile_mode(config(3, "PIECEWISE")) is True  # no CudaGraphModeError: static mode steers the graphs
    monkeypatch.setenv("SHMSTEER_VLLM_STATIC", "1")
    assert vstatic.static_mode(config(0, "NONE"))
    monkeypatch.setenv("SHMSTEER_VLLM_STATIC", "0")
    assert not vstatic.static_mode(config(3, "PIECEWISE"))
    with pytest.raises(CudaGraphModeError, match="SHMSTEER_VLLM_STATIC"):
        compile_mode(config(3, "PIECEWISE"))
    monkeypatch.setenv("SHMSTEER_VLLM_STATIC", "maybe")
    with pytest.raises(PluginConfigError, match="SHMSTEER_VLLM_STATIC"):
        vstatic.static_mode(config())
    assert vstatic.max_tokens(config(tokens=48)) == 48
    assert vstatic.max_tokens(config(tokens=48, sizes=[1, 2, 4, 64])) == 64


def test_build_allocates_and_seals_before_any_owner(monkeypatch):
    monkeypatch.setenv("SHMSTEER_VLLM_HOOKS", "post_block,mlp_in")
    monkeypatch.setenv("SHMSTEER_VLLM_STATIC_CAPTURE", "1")
    monkeypatch.setenv("SHMSTEER_VLLM_CAPTURE_ROWS", "5")
    m = _Model(LAYERS)
    hooks, sites = vstatic.build(m, config(tokens=6), compiled=False)
    assert isinstance(hooks, StaticHooks) and not hooks.bound and hooks.max_tokens == 6
    assert sites.static and sorted(sites.sites) == [("mlp_in", 0), ("mlp_in", 1), ("post_block", 0), ("post_block", 1)]
    assert hooks._scap is not None and hooks._scap.max_rows == 5
    x = torch.randn(4, HIDDEN)
    with torch.no_grad():
        assert torch.allclose(m(x.clone()), _Model(LAYERS)(x.clone())), "unbound: zeros added, no step needed"
    with pytest.raises(RuntimeError, match="sealed"):
        hooks.register("pre_attn", 0)
    monkeypatch.setenv("SHMSTEER_VLLM_STATIC_GATES", "-1")
    with pytest.raises(PluginConfigError, match="SHMSTEER_VLLM_STATIC_GATES"):
        vstatic.build(_Model(LAYERS), config(), compiled=False)
    sites.remove()
    hooks.close()


def test_static_worker_needs_hooks_built_at_load(monkeypatch):
    monkeypatch.setenv("SHMSTEER_VLLM_STATIC", "1")
    with pytest.raises(SitesNotAttachedError, match="static hooks"):
        WorkerSteering(_Model(1), config())


def admit(o: Any, scale: float) -> None:
    g = torch.Generator().manual_seed(int(scale * 10) % 97)
    vecs = [{"hook": h, "layer": ly, "scale": scale, "data": torch.randn(HIDDEN, generator=g).tolist()}
            for h in ("pre_attn", "post_attn", "mlp_in", "mlp_out", "post_block") for ly in range(LAYERS)]
    o.admit("a", override={"base": {"vectors": vecs[::2]}})
    o.admit("b", override={"base": {"vectors": vecs[1::2]}})


def steps(st: WorkerSteering, model: Any, xs: List[torch.Tensor]) -> List[torch.Tensor]:
    with torch.no_grad():
        return [st.run(SPANS, 6, lambda x=x: model(x.clone())) for x in xs]


@pytest.mark.parametrize("compiled", [False, True])
def test_static_worker_equals_the_eager_plugin_across_a_restart(ns, secret, monkeypatch, compiled):
    monkeypatch.delenv("SHMSTEER_VLLM_HOOKS", raising=False)
    monkeypatch.delenv("SHMSTEER_VLLM_STATIC_CAPTURE", raising=False)
    xs = [torch.randn(6, HIDDEN, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    torch.manual_seed(0)
    m_static, m_eager = _Model(LAYERS), _Model(LAYERS)
    monkeypatch.setenv("SHMSTEER_VLLM_STATIC", "1")
    cfg = config(mode=3 if compiled else 0)
    hooks, sites = vstatic.build(m_static, cfg, compiled=compiled)
    run_static: Any = m_static
    if compiled:
        torch._dynamo.reset()
        run_static = torch.compile(m_static, fullgraph=True)
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o1, \
            shmsteer.Owner(ns + "-2", secret=secret, hidden=HIDDEN, layers=LAYERS) as o2:
        admit(o1, 1.0)
        admit(o2, -0.5)
        fs = _Follower(o1)
        st = WorkerSteering(m_static, cfg, follower=fs, sites=sites, static=hooks)
        assert st.static
        monkeypatch.setenv("SHMSTEER_VLLM_STATIC", "0")
        fe = _Follower(o1)
        eager = WorkerSteering(m_eager, config(), follower=fe)
        for gen, o in enumerate((o1, o2)):
            fs.owner = fe.owner = o
            fs.gen = fe.gen = gen
            with torch._dynamo.config.patch(error_on_recompile=True):
                got = steps(st, run_static, xs)
            want = steps(eager, m_eager, xs)
            for g_, w_ in zip(got, want):
                torch.testing.assert_close(g_, w_)
            with torch.no_grad():  # outside a step, as a graph replay: the last prepared step's steering
                torch.testing.assert_close(run_static(xs[-1].clone()), got[-1])
            plain = _Model(LAYERS)
            plain.load_state_dict(m_eager.state_dict())
            with torch.no_grad():
                assert not torch.allclose(got[0][:3], plain(xs[0].clone())[:3]), f"owner {gen}: steered"
                torch.testing.assert_close(got[0][3:], plain(xs[0].clone())[3:])  # unsteered and padding rows
        assert st.hooks is hooks and st.steps == 6
        # The V2 runner's path: open() prepares (in prepare_inputs), a replay, close() reports.
        st.open(SPANS, 6)
        with torch.no_grad():
            v2 = run_static(xs[0].clone())
        st.close()
        torch.testing.assert_close(v2, got[0])
        assert st.steps == 7 and st._open is None
        st.shutdown()
        eager.shutdown()
        with shmsteer.Owner(ns + "-3", secret=secret, hidden=HIDDEN, layers=LAYERS, hooks=["post_block"]) as o3:
            fs.owner, fs.gen = o3, 2
            m3 = _Model(LAYERS)
            h3, s3 = vstatic.build(m3, config(), compiled=False)
            monkeypatch.setenv("SHMSTEER_VLLM_STATIC", "1")
            st3 = WorkerSteering(m3, config(), follower=fs, sites=s3, static=h3)
            with pytest.raises(StaticLayoutError):
                st3.ensure()
            h3.close()
