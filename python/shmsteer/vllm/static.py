"""Static mode in the vLLM plugin: the steering a CUDA-graph replay keeps.

A CUDA-graph replay runs the kernels captured once and nothing else: the plugin's Python (the
eager hooks, the compiled operator's kernel) runs only while vLLM captures the graphs. Static mode
(:class:`shmsteer.torch_hook.StaticHooks`) makes what is captured right for every later step:
every site reads persistent per-site tables, a row index and the gate and capture buffers,
allocated once, and the step's state is written into them outside the graph
(``StaticHooks.prepare(spans)`` before the forward, ``report()`` after it).

The plugin turns it on when vLLM's ``compilation_config.cudagraph_mode`` is not NONE, or when
``SHMSTEER_VLLM_STATIC=1`` asks for it (eager or compiled without CUDA graphs too: how it is
tested on the CPU backend); ``SHMSTEER_VLLM_STATIC=0`` turns it off (CUDA graphs are then refused,
:class:`~shmsteer.vllm.errors.CudaGraphModeError`). The buffers are made when the runner's
``load_model`` returns, before vLLM's warm-up captures any graph, with no owner yet (the owner is
made with the scheduler, after the warm-up): :func:`build` sizes them from the config and a fixed
layout, the model's hidden size and layers and the owner's default hook order
(:data:`~shmsteer.torch_hook.LAYOUT_HOOKS`); the worker binds them to the owner at its first step
(``StaticHooks.bind``, which refuses an owner of another layout) and again after a restart.

Sizes and settings:

* ``max_tokens``: the largest of ``max_num_batched_tokens`` and the captured sizes (every forward,
  the profiling run's included, has at most that many rows); padded rows of a captured size
  belong to no span and get slot 0 (zeros).
* dtype and device: the model's (``model_config.dtype``, its parameters' device).
* ``SHMSTEER_VLLM_STATIC_GATES``: probe-gate columns per row in the graph (default 4, the eager
  default; 0 leaves the gate work out and a probe gate is then ``BatchCapacityError``).
* capture buffers (``StaticHooks.capture_buffers``) are made when the process declares capture
  (``SHMSTEER_VLLM_CAPTURE`` or ``SHMSTEER_VLLM_CAPTURE_DIR``, the engine owner's settings) or
  ``SHMSTEER_VLLM_STATIC_CAPTURE=1`` (an external owner serving capture);
  ``SHMSTEER_VLLM_CAPTURE_ROWS`` rows per step over all sites (default ``max_tokens`` x the sites,
  at most 256 MiB of rows). An owner serving capture to hooks made without them is
  :class:`~shmsteer.torch_hook.StaticCaptureError` at the first step.
"""

from __future__ import annotations

import logging
import os
from typing import Any, List, Optional, Sequence, Tuple

from .errors import PluginConfigError
from .layers import HOOK_POINTS, LayerSites

__all__ = ["static_mode", "max_tokens", "build", "CAPTURE_BYTES"]

log = logging.getLogger("shmsteer.vllm")

CAPTURE_BYTES = 256 << 20
"""The most bytes of captured rows per step the default ``SHMSTEER_VLLM_CAPTURE_ROWS`` allocates."""


def _cudagraphs(vllm_config: Any) -> bool:
    cg = getattr(vllm_config.compilation_config, "cudagraph_mode", None)
    return getattr(cg, "name", str(cg)) not in ("NONE", "None")


def static_mode(vllm_config: Any) -> bool:
    """Whether the plugin steers in static mode: ``SHMSTEER_VLLM_STATIC`` (``1`` on, ``0`` off),
    by default when the model runs CUDA graphs (``cudagraph_mode`` other than NONE)."""
    raw = os.environ.get("SHMSTEER_VLLM_STATIC", "").strip().lower()
    if raw in ("1", "true", "on", "yes"):
        return True
    if raw in ("0", "false", "off", "no"):
        return False
    if raw:
        raise PluginConfigError(f"SHMSTEER_VLLM_STATIC={raw!r}: want 1 or 0 (unset: on with CUDA graphs)")
    return _cudagraphs(vllm_config)


def max_tokens(vllm_config: Any) -> int:
    """The most rows a forward of this config has: ``max_num_batched_tokens`` or the largest
    captured size, whichever is larger."""
    cc = vllm_config.compilation_config
    sizes: List[int] = [int(getattr(vllm_config.scheduler_config, "max_num_batched_tokens", 0) or 0),
                        int(getattr(cc, "max_cudagraph_capture_size", 0) or 0)]
    sizes += [int(s) for s in (getattr(cc, "cudagraph_capture_sizes", None) or [])]
    n = max(sizes)
    if n <= 0:
        raise PluginConfigError("shmsteer.vllm: static mode cannot size its buffers: no max_num_batched_tokens "
                                "or captured size in the config")
    return n


def _int_setting(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        v = int(raw)
    except ValueError:
        v = -1
    if v < 0:
        raise PluginConfigError(f"{name}={raw!r}: want an integer >= 0")
    return v


def _wants_capture() -> bool:
    if os.environ.get("SHMSTEER_VLLM_STATIC_CAPTURE", "").strip().lower() in ("1", "true", "on", "yes"):
        return True
    return any(os.environ.get(k, "").strip() for k in ("SHMSTEER_VLLM_CAPTURE", "SHMSTEER_VLLM_CAPTURE_DIR"))


def _hooks_wanted() -> List[str]:
    raw = os.environ.get("SHMSTEER_VLLM_HOOKS", "")
    want = [h.strip() for h in raw.split(",") if h.strip()] or list(HOOK_POINTS)
    bad = [h for h in want if h not in HOOK_POINTS]
    if bad:
        raise PluginConfigError(f"SHMSTEER_VLLM_HOOKS: {bad} not among the hook points {list(HOOK_POINTS)}")
    return want


def build(model: Any, vllm_config: Any, compiled: bool, hooks: Optional[Sequence[str]] = None) -> Tuple[Any, LayerSites]:
    """The static hooks of a loaded model and its sites, every buffer allocated and sealed (see
    the module doc); call before vLLM captures or traces anything. The sites are bound to the
    hooks (with the layout's hook ids) and run at every forward: outside a step the index holds
    the last step's rows or zeros."""
    import torch

    from ..torch_hook import StaticLayout, SteeringHooks
    from .engine import _model_dims
    hidden, layers = _model_dims(vllm_config.model_config)
    want = list(hooks) if hooks is not None else _hooks_wanted()
    layout = StaticLayout(hidden, layers)
    param = next(iter(model.parameters()), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = getattr(vllm_config.model_config, "dtype", None) or (param.dtype if param is not None else torch.float32)
    T = max_tokens(vllm_config)
    st = SteeringHooks(layout, static=True, max_tokens=T, device=device, dtype=dtype,
                       max_row_gates=_int_setting("SHMSTEER_VLLM_STATIC_GATES", 4))
    sites = LayerSites(model, st.apply, layout.hook_id, hooks=want, compiled=compiled, static=True)
    for hook, layer in sites.sites:
        st.register(hook, layer)
    if _wants_capture():
        n = len(sites.sites)
        row = hidden * torch.empty(0, dtype=dtype).element_size()
        default = max(1, min(T * n, CAPTURE_BYTES // row))
        st.capture_buffers(_int_setting("SHMSTEER_VLLM_CAPTURE_ROWS", default) or default)
    st.seal()
    log.info("shmsteer: static mode: buffers for %d sites, %d tokens, %s on %s%s", len(sites.sites), T, dtype, device,
             ", capture" if st._scap is not None else "")
    return st, sites
