"""The fork's hook points on vLLM's decoder layers.

vLLM's Llama-style decoder layers (Llama, Mistral, Qwen2, Qwen3, ...) do not return the residual
stream: ``forward(positions, hidden_states, residual)`` returns ``(hidden_states, residual)``
where ``hidden_states`` is the MLP branch's output and the stream is their *sum*, which the next
layer's fused ``input_layernorm(hidden_states, residual)`` (or the model's final ``norm``)
computes, normalises and carries on as its new ``residual``. Layer 0 gets ``residual=None`` and
takes its input as the stream. In vLLM's terms, for decoder layer L:

============  ==============================================================================
hook          what it is, and where the plugin hooks it
============  ==============================================================================
pre_attn      the stream entering layer L: ``hidden_states + residual`` of the layer's inputs
              (the embeddings at layer 0). A forward pre-hook on the layer folds the two into
              one tensor, steers it and passes ``(stream, None)``: the layer then takes it as
              its stream (``residual = stream``, ``input_layernorm(stream)``), exactly.
post_attn     the stream after attention's output is added: the inputs of
              ``post_attention_layernorm(attn_out, residual)``. A forward pre-hook on that norm
              folds ``attn_out`` into ``residual``, steers it and passes ``(zeros, stream)``: the
              fused add then yields the steered stream as ``residual`` and normalises it.
mlp_in        the normalised MLP input: the first input of ``layer.mlp``, steered in place by a
              forward pre-hook.
mlp_out       the MLP branch's output after the down-projection (and its all-reduce under
              tensor parallelism), before the residual add: ``layer.mlp``'s output, in place.
post_block    the block's output, the stream entering layer L+1: ``hidden_states + residual``
              of the layer's outputs. A forward hook folds the two, steers the sum and returns
              ``(zeros, stream)``; the next layer's fused add (or the final norm) gives back
              the steered stream.
============  ==============================================================================

Folding is what makes the stream sites right for everything but a plain add: a projection clamp,
an ablation, a probe gate and capture see the residual stream itself (``hidden + residual``),
never the MLP branch alone. A fold costs one add and one zero fill of the site's rows, in place
(``residual += hidden``, ``hidden = 0``: no allocation); it happens only at attached sites, and
eagerly only in a step (:attr:`LayerSites.active`), so vLLM's dummy and profiling runs are
untouched (compiled, below, the fold is in the graph: the same bits). Under tensor parallelism
every rank holds the whole stream
(``hidden_states`` comes out of the all-reduce of ``o_proj`` and ``down_proj``), so every rank
folds and steers the same rows.

:class:`LayerSites` attaches these hooks for a :class:`shmsteer.torch_hook.SteeringHooks` (it
calls only ``SteeringHooks.apply``), in one of two modes:

* eager (vLLM's ``-O0 --enforce-eager``): each hook checks :attr:`LayerSites.active` and does
  nothing outside a real step; it folds and applies only in one.
* compiled (vLLM's ``torch.compile``; on the CPU backend ``VLLM_COMPILE`` runs as
  ``DYNAMO_TRACE_ONCE`` with inductor): the hooks are attached right after the model loads,
  before the first (dummy) forward that vLLM traces, and Dynamo traces them into the graph. They
  hold no Python branch on step state: each folds unconditionally and calls one custom operator,
  ``torch.ops.shmsteer.vllm_site_(stream, sites, hook, layer)`` (a fake kernel for the trace; no
  graph break), whose kernel looks the sites up by their token and applies the open step's
  steering eagerly (:meth:`LayerSites.run`: nothing outside a step, so vLLM's warm-up and dummy
  runs are untouched). The spans and the step's resolve stay outside the graph, once per step.
  Hooks attached after the trace would be silently skipped (vLLM drops Dynamo's guards after
  its one trace), which is why compiled sites are attached at load time and bound to the owner's
  hooks later (:meth:`LayerSites.bind`). The fold's add and zero fill are in the graph, where
  inductor fuses them; a fold gives the same bits as the fused add it replaces.

The operator runs Python at run time, so it works under ``torch.compile`` without CUDA graphs
(vLLM's CPU backend has none); a CUDA-graph replay runs only the kernels it launched while the
graph was captured. In static mode (:mod:`shmsteer.vllm.static`, ``static=True``) those kernels
read persistent buffers that ``StaticHooks.prepare`` writes outside the graph, and the hooks steer
at every forward (eager ones too: no :attr:`LayerSites.active` check), so a replay steers the
step that was prepared.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .errors import UnsupportedModelError

__all__ = ["HOOK_POINTS", "KNOWN_LAYERS", "decoder_layers", "LayerSites"]

HOOK_POINTS: Tuple[str, ...] = ("pre_attn", "post_attn", "mlp_in", "mlp_out", "post_block")
"""The hook points this module places, in the order a layer runs them."""

KNOWN_LAYERS: Tuple[str, ...] = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer",
                                 "Qwen3DecoderLayer")
"""Decoder layer classes (or their bases) whose forward the hook table above describes."""

Apply = Callable[[torch.Tensor, int, int], None]


def _known(layer: torch.nn.Module) -> bool:
    return any(c.__name__ in KNOWN_LAYERS for c in type(layer).__mro__)


def decoder_layers(model: torch.nn.Module) -> List[Tuple[int, torch.nn.Module]]:
    """(global layer index, layer) of every decoder layer of a vLLM model this rank holds (a
    pipeline stage holds ``start_layer:end_layer``; the others are placeholders, skipped).

    Raises:
        UnsupportedModelError: no ``model.layers`` of a known family.
    """
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise UnsupportedModelError(f"shmsteer.vllm: {type(model).__name__} has no .model.layers")
    start = getattr(inner, "start_layer", 0)
    end = getattr(inner, "end_layer", len(layers))
    out = []
    for i in range(start, end):
        layer = layers[i]
        if not _known(layer):
            raise UnsupportedModelError(
                f"shmsteer.vllm: layer {i} is a {type(layer).__name__}; the plugin steers {', '.join(KNOWN_LAYERS)} "
                "and their subclasses")
        for attr in ("post_attention_layernorm", "mlp"):
            if not isinstance(getattr(layer, attr, None), torch.nn.Module):
                raise UnsupportedModelError(f"shmsteer.vllm: layer {i} ({type(layer).__name__}) has no .{attr}")
        out.append((i, layer))
    if not out:
        raise UnsupportedModelError(f"shmsteer.vllm: {type(model).__name__} holds no decoder layers on this rank")
    return out


def _fold(hidden: torch.Tensor, residual: Optional[torch.Tensor]) -> torch.Tensor:
    """The residual stream in one tensor: ``residual += hidden`` in place, returned (the same bits
    as the fused add it replaces: ``a + b == b + a``); layer 0's input (``residual`` None) as a
    copy. In place, as vLLM's own fused add-norm updates ``residual``: no allocation (a new tensor
    of a prefill's rows is a fresh mapping and its page faults, at every site)."""
    return hidden.clone() if residual is None else residual.add_(hidden)


_LIVE: Dict[int, "LayerSites"] = {}  # compiled sites by token: what the operator's kernel steers
_TOKENS = itertools.count(1)


@torch.library.custom_op("shmsteer::vllm_site_", mutates_args=("stream",))
def _site_op(stream: torch.Tensor, sites: int, hook: int, layer: int) -> None:
    """Steer ``stream`` in place at (HOOK_POINTS[hook], layer) for the open step of the compiled
    :class:`LayerSites` whose token is ``sites`` (nothing when none is live or no step is open)."""
    s = _LIVE.get(sites)
    if s is not None:
        s.run(stream, hook, layer)


@_site_op.register_fake
def _site_fake(stream: torch.Tensor, sites: int, hook: int, layer: int) -> None:
    return None


class LayerSites:
    """The hooks of the fork's hook points on a vLLM model's decoder layers.

    Args:
        model: the vLLM model (``runner.get_model()``).
        apply: ``apply(tensor, hook_id, layer)`` steering (and capturing) a site in place,
            :meth:`shmsteer.torch_hook.SteeringHooks.apply` (compiled: may come later, through
            :meth:`bind`).
        hook_id: the owner's hook id of a hook name (``handle.hook_id``), with ``apply``.
        hooks: hook points to attach (default: every one of :data:`HOOK_POINTS`).
        layers: the global layer indices to attach (default: every layer this rank holds).
        compiled: attach the compiled mode's hooks (see the module doc): before vLLM traces the
            model, never after.
        static: the hooks steer at every forward, in a step or not (static mode,
            :mod:`shmsteer.vllm.static`: what a captured CUDA graph replays must not depend on
            :attr:`active`; outside a step the static buffers hold zeros or the last step's rows).

    Set :attr:`active` for the forward passes of real steps only.
    """

    def __init__(self, model: torch.nn.Module, apply: Optional[Apply] = None,
                 hook_id: Optional[Callable[[str], int]] = None, hooks: Sequence[str] = HOOK_POINTS,
                 layers: Optional[Sequence[int]] = None, compiled: bool = False, static: bool = False) -> None:
        for h in hooks:
            if h not in HOOK_POINTS:
                raise UnsupportedModelError(f"shmsteer.vllm: hook {h!r}: this plugin places {', '.join(HOOK_POINTS)}")
        self.active = False
        self.compiled = compiled
        self.static = static
        self.token = next(_TOKENS)  #: the operator's handle on these sites (compiled mode)
        self._apply: Optional[Apply] = None
        self._ids: List[Optional[int]] = [None] * len(HOOK_POINTS)  # bound hook id per hook point
        self._handles: List[Any] = []
        self._attached: List[Tuple[str, int]] = []
        self.sites: Dict[Tuple[str, int], int] = {}  #: (hook, layer) -> hook id, attached and bound
        want = None if layers is None else set(layers)
        for idx, layer in decoder_layers(model):
            if want is not None and idx not in want:
                continue
            for h in hooks:
                self._attach(layer, h, idx)
                self._attached.append((h, idx))
        if compiled:
            _LIVE[self.token] = self
        if apply is not None:
            if hook_id is None:
                raise TypeError("LayerSites: apply needs hook_id")
            self.bind(apply, hook_id)

    def bind(self, apply: Apply, hook_id: Callable[[str], int], hooks: Optional[Sequence[str]] = None) -> None:
        """Steer through ``apply`` with the owner's hook ids, at the attached sites of ``hooks``
        (default: every attached hook point); the others do nothing."""
        want = set(hooks) if hooks is not None else {h for h, _ in self._attached}
        ids: List[Optional[int]] = [hook_id(h) if h in want else None for h in HOOK_POINTS]
        self._apply, self._ids = apply, ids
        self.sites = {(h, i): ids[HOOK_POINTS.index(h)] for h, i in self._attached if h in want}  # type: ignore[misc]

    def unbind(self) -> None:
        """Steer nothing until the next :meth:`bind` (compiled hooks stay in the graph)."""
        self._apply, self._ids = None, [None] * len(HOOK_POINTS)
        self.sites = {}

    def run(self, t: torch.Tensor, hook: int, layer: int) -> None:
        """Steer t in place at (HOOK_POINTS[hook], layer) in a step; nothing outside one."""
        if not self.active and not self.static:
            return
        hid = self._ids[hook]
        if hid is not None and self._apply is not None:
            self._apply(t, hid, layer)

    def _site(self, hook: str, idx: int) -> Callable[[torch.Tensor], None]:
        """What a hook does with its (folded) tensor: the operator when compiled, else run()."""
        k = HOOK_POINTS.index(hook)
        if self.compiled:
            token = self.token
            op = torch.ops.shmsteer.vllm_site_

            def steer(t: torch.Tensor) -> None:
                op(t, token, k, idx)
        else:
            run = self.run

            def steer(t: torch.Tensor) -> None:
                run(t, k, idx)
        return steer

    def _attach(self, layer: torch.nn.Module, hook: str, idx: int) -> None:
        steer, sites = self._site(hook, idx), self
        # Eager hooks return at once outside a step; compiled ones have no branch on it (traced).
        eager = not self.compiled and not self.static

        if hook == "pre_attn":
            def pre_attn(_m: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
                if eager and not sites.active:
                    return None
                a = list(args)
                hidden = a[1] if len(a) > 1 else kwargs["hidden_states"]
                residual = a[2] if len(a) > 2 else kwargs.get("residual")
                s = _fold(hidden, residual)
                steer(s)
                if len(a) > 1:
                    a[1] = s
                else:
                    kwargs["hidden_states"] = s
                if len(a) > 2:
                    a[2] = None
                else:
                    kwargs["residual"] = None
                return tuple(a), kwargs
            h = layer.register_forward_pre_hook(pre_attn, with_kwargs=True)
        elif hook == "post_attn":
            def post_attn(_m: Any, args: Tuple[Any, ...]) -> Any:
                if eager and not sites.active:
                    return None
                x, residual = args[0], args[1]
                s = _fold(x, residual)
                steer(s)
                return (x.zero_(), s) + tuple(args[2:])  # the norm's fused add: 0 + s
            h = layer.post_attention_layernorm.register_forward_pre_hook(post_attn)
        elif hook == "mlp_in":
            def mlp_in(_m: Any, args: Tuple[Any, ...]) -> None:
                if eager and not sites.active:
                    return
                steer(args[0])
            h = layer.mlp.register_forward_pre_hook(mlp_in)
        elif hook == "mlp_out":
            def mlp_out(_m: Any, _args: Any, out: Any) -> None:
                if eager and not sites.active:
                    return
                steer(out[0] if isinstance(out, (tuple, list)) else out)
            h = layer.mlp.register_forward_hook(mlp_out)
        else:  # post_block
            def post_block(_m: Any, _args: Any, out: Any) -> Any:
                if eager and not sites.active:
                    return None
                hidden, residual = out[0], out[1]
                s = _fold(hidden, residual)
                steer(s)
                return (hidden.zero_(), s) + tuple(out[2:])  # the next fused add: 0 + s
            h = layer.register_forward_hook(post_block)
        self._handles.append(h)

    def remove(self) -> None:
        """Remove every hook this object attached (a compiled graph that traced them keeps
        calling the operator, which then steers nothing)."""
        _LIVE.pop(self.token, None)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._attached.clear()
        self.unbind()
