"""The worker side of the vLLM plugin: attach to the owner, hook the decoder layers, step.

Each model runner gets one :class:`WorkerSteering` the first time it runs a real step (dummy,
profiling and warm-up runs never reach it): it follows the owner (:class:`shmsteer.Follower` in
namespace ``SHMSTEER_NAMESPACE``, ``-dp<rank>`` under data parallelism; secret from
``SHMSTEER_SECRET`` or ``SHMSTEER_SECRET_FILE``), builds a :class:`~shmsteer.torch_hook.SteeringHooks`
on the follower's client and attaches :class:`~shmsteer.vllm.layers.LayerSites` to the model's
decoder layers (the hooks of ``SHMSTEER_VLLM_HOOKS``, default every hook point the owner's model
config has). When the owner restarts, the next step re-attaches to the new one. If the owner
serves capture, the hooks capture too (:func:`~shmsteer.vllm.capture.start_worker_capture`:
tensor-parallel rank 0 writes).

Per step, the spans are resolved once from the runner's batch, before the forward pass
(:mod:`shmsteer.vllm.spans`), and the forward runs inside ``SteeringHooks.step(spans, rows=...)``
with the padded row count, so padding rows are never steered:

* V1 runner (``GPUModelRunner``, ``CPUModelRunner``): ``_model_forward`` is wrapped; the spans
  come from ``input_batch`` and ``query_start_loc``, already prepared.
* V2 runner (``vllm.v1.worker.gpu.model_runner.GPUModelRunner`` and its CPU subclass):
  ``prepare_inputs`` is wrapped to resolve the spans of the ``InputBatch`` it returns and read
  the scheduler's version from the ``SchedulerOutput`` it is given; a forward
  pre-hook on the model opens the step and a forward hook closes it (``execute_model`` is wrapped
  to close a step a failed forward left open). In static mode ``prepare_inputs`` opens the step
  itself (a full-graph replay skips the model's hooks) and ``execute_model`` closes it.

Eager or compiled: under vLLM's ``torch.compile`` (compilation mode above NONE; on the CPU backend
``VLLM_COMPILE`` runs as ``DYNAMO_TRACE_ONCE`` with inductor) the runner's ``load_model`` is
wrapped to attach compiled :class:`~shmsteer.vllm.layers.LayerSites` as soon as the model loads,
before vLLM's first (traced) forward; each site is one ``torch.ops.shmsteer.vllm_site_`` call in
the graph, and the worker binds them to the owner's hooks at its first step.

Static mode (:mod:`shmsteer.vllm.static`: CUDA graphs, or ``SHMSTEER_VLLM_STATIC=1``): the
wrapped ``load_model`` also builds :class:`~shmsteer.torch_hook.StaticHooks` on a fixed layout
with every buffer allocated, before any graph is captured, and sites that steer at every forward
through them; per step the worker calls ``prepare(spans)`` in place of the step's resolve and
``report()`` after the forward, and binds the hooks to the owner (again after a restart) without
reallocating anything. Without static mode CUDA graphs are refused
(:class:`~shmsteer.vllm.errors.CudaGraphModeError` at the first step): a replay would skip the
operator's Python kernel.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, List, Optional, Sequence, Tuple

from .capture import start_worker_capture
from .errors import CudaGraphModeError, PluginConfigError, SitesNotAttachedError, UnsupportedModelError
from .layers import HOOK_POINTS, LayerSites, decoder_layers
from .spans import Span, spans_from_v1, spans_from_v2
from .static import build as build_static
from .static import static_mode

__all__ = ["WorkerSteering", "patch_runners", "patch_v2_runner", "compile_mode"]

log = logging.getLogger("shmsteer.vllm")


def compile_mode(vllm_config: Any) -> bool:
    """Whether the model runs under vLLM's ``torch.compile`` (compilation mode above NONE).

    Raises:
        CudaGraphModeError: the model runs CUDA graphs (``cudagraph_mode`` other than NONE) and
            static mode is off (``SHMSTEER_VLLM_STATIC=0``).
    """
    cc = vllm_config.compilation_config
    mode = getattr(cc, "mode", None)
    mode = getattr(mode, "value", mode)
    cg = getattr(cc, "cudagraph_mode", None)
    cg_name = getattr(cg, "name", str(cg))
    if cg_name not in ("NONE", "None") and not static_mode(vllm_config):
        raise CudaGraphModeError(
            f"shmsteer.vllm: the model runs with cudagraph mode {cg_name}; the plugin steers eagerly or under "
            "torch.compile without CUDA graphs unless static mode is on (SHMSTEER_VLLM_STATIC unset or 1): "
            "compilation_config={'cudagraph_mode': 'NONE'} (-cc.cudagraph_mode=NONE) or --enforce-eager")
    return mode not in (0, None)


def _hooks_setting(owner_hooks: Sequence[str]) -> List[str]:
    raw = os.environ.get("SHMSTEER_VLLM_HOOKS", "")
    want = [h.strip() for h in raw.split(",") if h.strip()] or [h for h in HOOK_POINTS if h in owner_hooks]
    bad = [h for h in want if h not in HOOK_POINTS or h not in owner_hooks]
    if bad:
        raise PluginConfigError(f"SHMSTEER_VLLM_HOOKS: {bad} not among the hook points {list(HOOK_POINTS)} "
                                f"the owner's model has ({list(owner_hooks)})")
    return want


class WorkerSteering:
    """The steering of one model runner's forward passes (see the module doc).

    Args:
        model: the runner's model (``runner.get_model()``).
        vllm_config: the runner's config (eager check, namespace, tensor-parallel rank).
        follower: a :class:`shmsteer.Follower`, or a factory of one (default: from the
            environment, attached at the first step).
    """

    def __init__(self, model: Any, vllm_config: Any, follower: Any = None,
                 sites: Optional[LayerSites] = None, static: Any = None) -> None:
        self.compiled = compile_mode(vllm_config)
        self.static = static_mode(vllm_config)
        if self.static and (static is None or sites is None or not sites.static):
            raise SitesNotAttachedError(
                "shmsteer.vllm: static mode is on but no static hooks were built when the model loaded (the "
                "runner's load_model was not wrapped): a captured graph would not steer; SHMSTEER_VLLM_STATIC=0 "
                "with -O0 --enforce-eager")
        self.static_hooks: Any = static  #: static mode's hooks, built at load (buffers sealed)
        if self.compiled and (sites is None or not sites.compiled):
            raise SitesNotAttachedError(
                "shmsteer.vllm: the model is compiled but no compiled sites were attached when it loaded (the "
                "runner's load_model was not wrapped): steering would be skipped; run it with -O0 --enforce-eager")
        self.model = model
        self.vllm_config = vllm_config
        self._follower = follower
        self._gen = -1
        self.hooks: Any = None
        self.sites: Optional[LayerSites] = sites  # compiled: attached at load, bound here
        self._open: Any = None  # the step context a V2 forward pre-hook entered
        self.steps = 0  #: real steps run through the hooks
        self.capturing = False  #: whether the hooks capture (the owner serves capture)
        self.version = 0  #: the version the last step was handed (0: none, the current one)

    def _make_follower(self) -> Any:
        from ..client import Follower
        from .engine import namespace
        pc = self.vllm_config.parallel_config
        ns = namespace(int(getattr(pc, "data_parallel_rank", 0) or 0), int(getattr(pc, "data_parallel_size", 1) or 1))
        timeout = float(os.environ.get("SHMSTEER_VLLM_ATTACH_TIMEOUT", "30"))
        from .engine import owner_mode
        return Follower(ns, timeout=timeout, ready="serve" if owner_mode() == "external" else None)

    def ensure(self) -> Any:
        """The hooks of the current owner, built (or rebuilt after an owner restart) here."""
        if self._follower is None:
            self._follower = self._make_follower()
        elif callable(self._follower) and not hasattr(self._follower, "current"):
            self._follower = self._follower()
        client, gen, _dead = self._follower.current()
        if gen == self._gen and self.hooks is not None:
            return self.hooks
        self._teardown()
        from ..torch_hook import SteeringHooks
        hidden, layers, owner_hooks = client.model
        cfg = self.vllm_config.model_config
        hf = cfg.hf_text_config if hasattr(cfg, "hf_text_config") else cfg.hf_config
        if (hf.hidden_size, hf.num_hidden_layers) != (hidden, layers):
            raise UnsupportedModelError(f"shmsteer.vllm: the owner steers hidden {hidden} x {layers} layers, the model "
                                        f"is {hf.hidden_size} x {hf.num_hidden_layers}")
        if self.static:  # the sites were bound at load with the layout's hook ids, which bind() checks
            hooks = self.static_hooks
            hooks.bind(client)  # StaticLayoutError for an owner of another layout
        elif self.compiled:
            hooks = SteeringHooks(client)
            assert self.sites is not None
            self.sites.bind(hooks.apply, client.hook_id, _hooks_setting(owner_hooks))
        else:
            hooks = SteeringHooks(client)
            self.sites = LayerSites(self.model, hooks.apply, client.hook_id, _hooks_setting(owner_hooks))
        self.hooks, self._gen = hooks, gen
        self.capturing = start_worker_capture(hooks)
        log.info("shmsteer: worker attached (generation %d), %d sites%s", gen, len(self.sites.sites),
                 ", capturing" if self.capturing else "")
        return hooks

    def _teardown(self) -> None:
        if self.static:
            return  # the buffers stay (a captured graph reads them); bind() drops the old stepper
        if self.sites is not None and self.compiled:
            self.sites.unbind()  # traced into the graph: they stay, steering nothing until bound again
        elif self.sites is not None:
            self.sites.remove()
            self.sites = None
        if self.hooks is not None:
            self.hooks.close()
            self.hooks = None

    def run(self, spans: Sequence[Span], rows: int, forward: Callable[[], Any], version: int = 0) -> Any:
        """Run ``forward()`` as one steered step over ``rows`` rows laid out by ``spans``, pinned
        at the region ``version`` the scheduler handed every rank (0: the current one)."""
        hooks = self.ensure()
        assert self.sites is not None
        self.version = version
        if self.static:
            hooks.prepare(list(spans), version=version)
            self.sites.active = True
            try:
                out = forward()
            finally:
                self.sites.active = False
                self.steps += 1
            hooks.report()
            return out
        with hooks.step(list(spans), version=version, rows=rows):
            self.sites.active = True
            try:
                return forward()
            finally:
                self.sites.active = False
                self.steps += 1

    def open(self, spans: Sequence[Span], rows: int, version: int = 0) -> None:
        """Enter a step (V2: the model's forward pre-hook) pinned at the region ``version`` the
        scheduler handed every rank (0: the current one); :meth:`close` leaves it."""
        self.close()
        hooks = self.ensure()
        assert self.sites is not None
        self.version = version
        if self.static:
            hooks.prepare(list(spans), version=version)
            self._open = hooks
            self.sites.active = True
            return
        ctx = hooks.step(list(spans), version=version, rows=rows)
        ctx.__enter__()
        self._open = ctx
        self.sites.active = True

    def close(self, exc: Optional[BaseException] = None) -> None:
        """Leave the step :meth:`open` entered, if any."""
        ctx, self._open = self._open, None
        if ctx is None:
            return
        if self.sites is not None:
            self.sites.active = False
        self.steps += 1
        if self.static:
            if exc is None:
                ctx.report()
            return
        if exc is None:
            ctx.__exit__(None, None, None)
        else:
            ctx.__exit__(type(exc), exc, exc.__traceback__)

    def shutdown(self) -> None:
        """Remove the hooks, close the stepper and stop following."""
        self.close()
        self._teardown()
        if self.static and self.static_hooks is not None:
            self.static_hooks.close()
            self.static_hooks = self.hooks = None
        if self.sites is not None:
            self.sites.remove()
            self.sites = None
        if self._follower is not None and hasattr(self._follower, "close"):
            self._follower.close()


def _steering(runner: Any) -> WorkerSteering:
    st = runner.__dict__.get("_shmsteer")
    if st is None:
        st = runner._shmsteer = WorkerSteering(runner.get_model(), runner.vllm_config,
                                               sites=runner.__dict__.get("_shmsteer_sites"),
                                               static=runner.__dict__.get("_shmsteer_static"))
    return st


COMPILE_CACHE_KEY = "compiled-sites-1"
"""What the plugin adds to ``vllm_config.additional_config["shmsteer_vllm"]`` with compiled sites."""


def _key_compile_cache(vllm_config: Any) -> None:
    """Make vLLM's compile cache tell graphs with the compiled sites from graphs without them.

    vLLM saves the compiled model (``torch_compile_cache/torch_aot_compile/<hash>``) under a hash
    of its config and the model's forward, not of the hooks Dynamo traced: a graph compiled with
    the plugin off, loaded with it on, would steer nothing, silently. ``additional_config`` is in
    that hash. Where it is not a dict, the cache is turned off instead."""
    ac = vllm_config.additional_config
    if isinstance(ac, dict):
        ac["shmsteer_vllm"] = COMPILE_CACHE_KEY
        return
    os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"
    log.warning("shmsteer: additional_config is a %s, not a dict: vLLM's compile cache turned off "
                "(VLLM_DISABLE_COMPILE_CACHE=1) so that no graph without the compiled sites is loaded",
                type(ac).__name__)


def _wrap_load_model(cls: Any) -> None:
    """Wrap ``cls.load_model`` (where cls defines it) to attach compiled sites to the loaded model
    when it will run under torch.compile: before vLLM's first forward traces it."""
    orig = cls.__dict__.get("load_model")
    if orig is None or getattr(orig, "_shmsteer", False):
        return

    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(self, *args, **kwargs)
        if self.__dict__.get("_shmsteer_sites") is not None:
            return out
        compiled = compile_mode(self.vllm_config)
        if static_mode(self.vllm_config):
            self._shmsteer_static, self._shmsteer_sites = build_static(self.get_model(), self.vllm_config, compiled)
        elif compiled:
            self._shmsteer_sites = LayerSites(self.get_model(), compiled=True)
        if compiled:
            _key_compile_cache(self.vllm_config)
            log.info("shmsteer: compiled sites attached at load (%d layers)", len(decoder_layers(self.get_model())))
        return out

    load_model._shmsteer = True  # type: ignore[attr-defined]
    cls.load_model = load_model


def _rows(kwargs: Any) -> int:
    for k in ("input_ids", "inputs_embeds"):
        t = kwargs.get(k)
        if t is not None:
            return int(t.shape[0])
    pos = kwargs["positions"]
    return int(pos.shape[-1])


def _patch_v1() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    if getattr(GPUModelRunner, "_shmsteer_patched", False):
        return
    orig = GPUModelRunner._model_forward

    def _model_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args:  # the runner passes keywords; positional calls keep their meaning
            names = ("input_ids", "positions", "intermediate_tensors", "inputs_embeds")
            kwargs.update(dict(zip(names, args)))
            args = ()
        st = _steering(self)
        rows = _rows(kwargs)
        spans = spans_from_v1(self, rows)
        return st.run(spans, rows, lambda: orig(self, **kwargs), self.__dict__.get("_shmsteer_version", 0))

    orig_execute = GPUModelRunner.execute_model

    def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        # The scheduler's version for this step (engine.patch_scheduler), read by _model_forward.
        self._shmsteer_version = int(getattr(scheduler_output, "shmsteer_version", 0) or 0)
        return orig_execute(self, scheduler_output, *args, **kwargs)

    GPUModelRunner._model_forward = _model_forward
    GPUModelRunner.execute_model = execute_model
    _wrap_load_model(GPUModelRunner)
    try:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
        _wrap_load_model(CPUModelRunner)  # its own load_model, not calling the GPU runner's
    except ImportError as e:
        log.info("shmsteer: CPU model runner not patched: %s", e)
    GPUModelRunner._shmsteer_patched = True


def _patch_v2() -> None:
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2
    patch_v2_runner(V2)


def patch_v2_runner(V2: Any) -> None:
    """Wrap a V2 model runner class (``prepare_inputs(scheduler_output, ...)`` returning an
    ``InputBatch``, ``execute_model``, ``get_model``; once). The step is pinned at the version
    the scheduler handed every rank (``scheduler_output.shmsteer_version``, 0: the current one)."""
    if getattr(V2, "_shmsteer_patched", False):
        return
    orig_prepare, orig_execute = V2.prepare_inputs, V2.execute_model

    def prepare_inputs(self: Any, *args: Any, **kwargs: Any) -> Any:
        batch = orig_prepare(self, *args, **kwargs)
        so = args[0] if args else kwargs.get("scheduler_output")
        version = int(getattr(so, "shmsteer_version", 0) or 0)
        st = _steering(self)
        st.ensure()
        if not self.__dict__.get("_shmsteer_hooked"):
            model = self.get_model()
            model.register_forward_pre_hook(lambda _m, _a: _v2_open(self))
            model.register_forward_hook(lambda _m, _a, _o: st.close())
            self._shmsteer_hooked = True
        if st.static:
            # A full-graph replay (cudagraph_manager.run_fullgraph) bypasses the model's forward
            # hooks: static mode prepares the step here, outside the graph, and reports at the
            # end of execute_model (or at the next prepare).
            st.open(*spans_from_v2(batch), version)
        else:
            self._shmsteer_pending = (*spans_from_v2(batch), version)
        return batch

    def execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            out = orig_execute(self, *args, **kwargs)
        except BaseException as e:
            st = self.__dict__.get("_shmsteer")
            if st is not None:
                st.close(e)
            raise
        finally:
            self._shmsteer_pending = None
        st = self.__dict__.get("_shmsteer")
        if st is not None and st.static:
            st.close()  # the step prepare_inputs opened (none when the forward hook closed it)
        return out

    V2.prepare_inputs = prepare_inputs
    V2.execute_model = execute_model
    _wrap_load_model(V2)
    V2._shmsteer_patched = True


def _v2_open(runner: Any) -> None:
    pending: Optional[Tuple[List[Span], int, int]] = runner.__dict__.get("_shmsteer_pending")
    if pending is None:
        return  # a dummy or warm-up forward
    runner._shmsteer_pending = None
    runner._shmsteer.open(*pending)


def patch_runners() -> None:
    """Wrap both model runners (each once); a runner that does not import here is skipped."""
    _patch_v1()
    try:
        _patch_v2()
    except ImportError as e:  # the V2 runner needs parts some builds lack
        log.info("shmsteer: V2 model runner not patched: %s", e)
