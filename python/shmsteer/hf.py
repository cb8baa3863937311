"""Steer a Hugging Face ``transformers`` causal LM: per-request steering, capture and gates in
``generate()``, with the spans built for you.

:class:`HFSteering` owns one :class:`~shmsteer.torch_hook.SteeringHooks` (built from the
handle, or handed in) attached to a model's decoder layers at the engine's hook points, plus a
forward pre-hook and hook on the model itself that open and close one steering step per forward
pass. Start with::

    from shmsteer.hf import HFSteering
    steer = HFSteering(model, owner)                       # every hook point of every layer
    owner.admit("r1", override={...})                     # as for any worker
    batch = tokenizer(prompts, return_tensors="pt", padding=True)   # padding_side="left"
    out = steer.generate(["r1", None], **batch, max_new_tokens=20)  # None: an unsteered row

One request is one batch row. Each forward pass's spans are built from its ``attention_mask``:
row ``i`` of a ``[batch, seq]`` forward owns the flattened rows ``[i*seq + pad, (i+1)*seq)`` of
the hooked ``[batch*seq, hidden]`` tensors (left padding is never owned, so never steered or
captured), its positions counted from its first real token (as the model's ``position_ids``);
tokens at positions below the request's prompt length are ``prefill``, the others ``decode``.
The prompt length of each row is its real token count in the context's first forward (the
prompt), or ``prompt_lens=``; admit capturing requests with the same ``prompt_len=``
(:meth:`HFSteering.prompt_lens` computes them from an attention mask). Outside
:meth:`HFSteering.requests` / :meth:`HFSteering.generate` a forward runs with no spans: nothing is
steered.

Hook points, in Hugging Face terms, for decoder layer ``L`` (``model.model.layers[L]``, GPT-2's
``model.transformer.h[L]``), ``h`` its input hidden states (the residual stream):

* ``pre_attn``: ``h``, the residual stream entering attention: the input of ``input_layernorm``
  (GPT-2: ``ln_1``). The same tensor as ``post_block`` of layer ``L-1`` (for ``L = 0`` the
  embeddings' output): steering both adds both.
* ``post_attn``: ``h + attn(norm(h))``, the residual stream after attention's output is added:
  the input of ``post_attention_layernorm`` (GPT-2: ``ln_2``; Gemma 2/3:
  ``pre_feedforward_layernorm``, after attention's own post-norm).
* ``mlp_in``: that norm's output, the MLP's input.
* ``mlp_out``: the MLP branch's output before it is added to the residual stream (``mlp``'s
  output; Gemma 2/3: after ``post_feedforward_layernorm``).
* ``post_block``: the decoder layer's output (its first element when it returns a tuple),
  ``h + attn + mlp``, the residual stream entering layer ``L+1``: ``hidden_states[L+1]`` of
  ``output_hidden_states=True`` except after the last layer (there Hugging Face returns the
  final norm's output).

``pre_attn`` and ``post_attn`` are steered in place in the tensor the layer keeps as its
residual, so the steering stays in the stream; ``mlp_in`` and ``mlp_out`` change only the MLP's
input or contribution. Captures see each site's rows before its own steering. Steering runs in
place, for inference (``generate`` runs under ``no_grad``); a caller's ``inputs_embeds`` tensor
is steered in place at ``pre_attn`` of layer 0.

Static hooks (``SteeringHooks(handle, static=True, max_tokens=..., device=..., dtype=...)``,
handed in as ``hooks=``) are prepared before each forward and report after it, so the forward
itself (a CUDA graph, a ``torch.compile``d ``model.forward``) only reads their static buffers;
``max_tokens`` must hold the largest forward's ``batch * seq`` rows (the prefill's). To compile,
attach first, then compile the forward, not the module (``model.forward =
torch.compile(model.forward, fullgraph=True)``), so that this object's per-forward work on the
model itself runs eagerly around the graph (``python/benchmarks/hf_compile.py``). The sites are
wrappers of the modules' ``forward`` (not module hooks, which dynamo does not guard by default),
so a forward compiled before attaching, or an unsteered twin of the same class, recompiles.

Supported ``model_type``: llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, gpt2 (see
:data:`LAYOUTS`); another decoder with the same sequential pre-norm block takes a
:class:`Layout` naming its modules. Beam search and ``num_return_sequences > 1`` change the batch:
:class:`RequestBatchError`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ._common import I32
from .client import SpanLike, _Handle
from .device import PackedSpans, SpanPacker
from .errors import HiddenSizeError, LayerRangeError, ShmsteerError, UnknownHookError
from .torch_hook import SteeringHooks

#: The hook points this module attaches, in the order of the residual stream within a layer.
HOOK_POINTS = ("pre_attn", "post_attn", "mlp_in", "mlp_out", "post_block")


class UnsupportedModelError(ShmsteerError, TypeError):
    """The model is not a decoder whose layers :class:`HFSteering` knows (its ``model_type`` has
    no :data:`LAYOUTS` entry, or a layer lacks a module the layout names). Nothing was attached."""


class RequestBatchError(ShmsteerError, ValueError):
    """A forward pass's batch does not match the requests: another number of rows than request
    ids (beam search, ``num_return_sequences``), right padding, or a mask that is not
    ``[batch, length]`` of zeros and ones. Nothing was steered."""


@dataclass(frozen=True)
class Layout:
    """Where a decoder's hook points are: attribute paths (dotted) from the base model to the
    decoder layer list, and from a layer to its modules.

    Attributes:
        layers: the decoder layers (a ``ModuleList``), from ``model.base_model``.
        attn_norm: the norm before attention; its input is ``pre_attn``.
        mlp_norm: the norm before the MLP; its input is ``post_attn``, its output ``mlp_in``.
        mlp: the MLP; its output is ``mlp_out`` unless ``mlp_out`` names another module.
        mlp_out: the module whose output is the MLP branch added to the residual (None: ``mlp``).
    """

    layers: str
    attn_norm: str
    mlp_norm: str
    mlp: str
    mlp_out: Optional[str] = None


_PRE_NORM = Layout("layers", "input_layernorm", "post_attention_layernorm", "mlp")
_SANDWICH = Layout("layers", "input_layernorm", "pre_feedforward_layernorm", "mlp", "post_feedforward_layernorm")

#: Known layouts by ``config.model_type``.
LAYOUTS: Dict[str, Layout] = {
    "llama": _PRE_NORM,
    "mistral": _PRE_NORM,
    "qwen2": _PRE_NORM,
    "qwen3": _PRE_NORM,
    "gemma": _PRE_NORM,
    "gemma2": _SANDWICH,
    "gemma3_text": _SANDWICH,
    "gpt2": Layout("h", "ln_1", "ln_2", "mlp"),
}


def _get(root: torch.nn.Module, path: str, what: str) -> torch.nn.Module:
    obj: Any = root
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise UnsupportedModelError(f"shmsteer.hf: {type(root).__name__} has no {what} {path!r}")
    if not isinstance(obj, torch.nn.Module):
        raise UnsupportedModelError(f"shmsteer.hf: {what} {path!r} of {type(root).__name__} is not a module")
    return obj


def find_layout(model: torch.nn.Module) -> Layout:
    """The :data:`LAYOUTS` entry of the model's ``config.model_type``; UnsupportedModelError
    for a model without one."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in LAYOUTS:
        raise UnsupportedModelError(
            f"shmsteer.hf: model_type {kind!r} ({type(model).__name__}) has no known layout "
            f"(known: {', '.join(sorted(LAYOUTS))}); pass layout=Layout(...) for a sequential pre-norm decoder")
    return LAYOUTS[kind]


@dataclass(frozen=True)
class Block:
    """One decoder layer's modules at the hook points."""

    layer: torch.nn.Module
    attn_norm: torch.nn.Module
    mlp_norm: torch.nn.Module
    mlp_out: torch.nn.Module


def decoder_blocks(model: torch.nn.Module, layout: Optional[Layout] = None) -> List[Block]:
    """The model's decoder layers and their hook-point modules, in order."""
    layout = layout or find_layout(model)
    base = getattr(model, "base_model", model)
    layers = _get(base, layout.layers, "decoder layer list")
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise UnsupportedModelError(f"shmsteer.hf: {layout.layers!r} is not a non-empty ModuleList")
    return [Block(layer, _get(layer, layout.attn_norm, "attention norm"), _get(layer, layout.mlp_norm, "MLP norm"),
                  _get(layer, layout.mlp_out or layout.mlp, "MLP output module")) for layer in layers]


class _Requests:
    """One batch of requests, one a row, and what their forwards have consumed so far."""

    def __init__(self, ids: Sequence[Optional[str]], prompt_lens: Optional[Sequence[int]]) -> None:
        self.ids = list(ids)
        if prompt_lens is not None and len(prompt_lens) != len(self.ids):
            raise RequestBatchError(f"shmsteer.hf: {len(prompt_lens)} prompt lengths for {len(self.ids)} requests")
        self.prompt = None if prompt_lens is None else np.asarray(prompt_lens, dtype=np.int64)
        self.seen = np.zeros(len(self.ids), dtype=np.int64)
        self._full_key: Tuple[int, int] = (-1, -1)
        self._full_q = np.zeros(0, dtype=np.int64)
        self._packer = SpanPacker()  # keeps the packed ids alive
        self._decode: Optional[_Decode] = None  # the packed layout of a whole-row decode forward

    def forward_spans(self, batch: int, seq: int, mask: Optional[torch.Tensor]) -> Tuple[Any, np.ndarray]:
        """This forward's spans, as :meth:`spans` gives them, or packed
        (:class:`~shmsteer.device.PackedSpans`) for a forward without a mask whose steered rows
        all decode: the layout packed at the first such forward of this seq, its first positions
        rewritten from ``seen`` (one numpy copy); every other forward goes through :meth:`spans`
        and drops the layout."""
        d = self._decode
        if mask is None and d is not None and d.seq == seq and batch == len(self.ids) and d.left > 0:
            d.left -= 1
            d.first[:] = self.seen if d.rows is None else self.seen[d.rows]
            return d.packed, self._full(batch, seq)
        self._decode = None
        spans, q = self.spans(batch, seq, mask)
        if mask is None and spans and seq > 0 and all(sp[3] == "decode" and sp[2] - sp[1] == seq for sp in spans):
            self._decode = _Decode(self, seq, spans)
            return self._decode.packed, q
        return spans, q

    def spans(self, batch: int, seq: int, mask: Optional[torch.Tensor]) -> Tuple[List[SpanLike], np.ndarray]:
        """This forward's spans (5-tuples) and each row's real token count in it. Once per
        forward, on the host around the (possibly compiled) model: whole-array numpy, then one
        loop over the rows on Python ints."""
        if batch != len(self.ids):
            raise RequestBatchError(f"shmsteer.hf: the forward has {batch} batch rows, the requests are {len(self.ids)} "
                                    "(one request a row: no beam search or num_return_sequences > 1)")
        if mask is None:  # a forward of whole rows (the usual compiled decode): Python ints only
            return self._whole_rows(seq), self._full(batch, seq)
        else:
            m = mask.detach().to("cpu").numpy()
            if m.ndim != 2 or m.shape[0] != batch or m.shape[1] < seq or ((m != 0) & (m != 1)).any():
                raise RequestBatchError(f"shmsteer.hf: attention_mask of shape {tuple(m.shape)} for a [{batch}, {seq}] "
                                        "forward: want [batch, length >= seq] of zeros and ones")
            m = m.astype(np.int64, copy=False)
            cur = m[:, m.shape[1] - seq:]
            if seq > 1 and (cur[:, 1:] < cur[:, :-1]).any():
                raise RequestBatchError("shmsteer.hf: right padding in the forward's tokens: tokenize with "
                                        "padding_side='left'")
            q = cur.sum(axis=1)
            total = m.sum(axis=1)
        if self.prompt is None:
            self.prompt = total.copy()  # the first forward holds the whole prompt
        out: List[SpanLike] = []
        for i, (rid, n, p0, plen) in enumerate(zip(self.ids, q.tolist(), (total - q).tolist(), self.prompt.tolist())):
            if rid is None or n == 0:
                continue
            start, end = i * seq + seq - n, (i + 1) * seq
            pre = min(max(plen - p0, 0), n)
            if pre:
                out.append((rid, start, start + pre, "prefill", p0))
            if pre < n:
                out.append((rid, start + pre, end, "decode", p0 + pre))
        return out, q


    def _whole_rows(self, seq: int) -> List[SpanLike]:
        """The spans of a forward without a mask: every row's seq tokens are real (two numpy
        calls, then Python ints: this runs once a step, between the model's steps, where every
        numpy call misses cache)."""
        seen = self.seen.tolist()
        if self.prompt is None:
            self.prompt = self.seen + seq  # the first forward holds the whole prompt
        out: List[SpanLike] = []
        for i, (rid, p0, plen) in enumerate(zip(self.ids, seen, self.prompt.tolist())):
            if rid is None or seq == 0:
                continue
            start, end = i * seq, (i + 1) * seq
            pre = min(max(plen - p0, 0), seq)
            if pre:
                out.append((rid, start, start + pre, "prefill", p0))
            if pre < seq:
                out.append((rid, start + pre, end, "decode", p0 + pre))
        return out

    def _full(self, batch: int, seq: int) -> np.ndarray:
        """Each row's real tokens when all are real, one read-only array per shape."""
        key = (batch, seq)
        if self._full_key != key:
            self._full_q = np.full(batch, seq, dtype=np.int64)
            self._full_q.flags.writeable = False
            self._full_key = key
        return self._full_q


class _Decode:
    """A whole-row decode forward's packed spans (one decode span per steered row), reused by
    the next forwards of the same seq: only their first positions change (each row's ``seen``),
    written into the packing's own field; ``left`` forwards more keep every position an int32
    (then the layout is packed again, which refuses a position past it)."""

    __slots__ = ("seq", "packed", "first", "rows", "left")

    def __init__(self, reqs: _Requests, seq: int, spans: List[SpanLike]) -> None:
        self.seq = seq
        self.packed: PackedSpans = reqs._packer.pack(spans)
        self.first = self.packed.arr["first_position"]
        rows = [int(sp[1]) // seq for sp in spans]
        self.rows = None if rows == list(range(len(reqs.ids))) else np.asarray(rows, dtype=np.int64)
        top = max(int(sp[4]) for sp in spans)  # type: ignore[misc]
        self.left = (I32[1] - top) // seq


class HFSteering:
    """Steering hooks on a Hugging Face causal LM, one step per forward pass (see the module doc).

    Args:
        model: a ``transformers`` causal LM (or its base model) of a known ``model_type``.
        handle: a :class:`~shmsteer.Client` or :class:`~shmsteer.Owner` whose model config has
            the model's hidden size and layer count.
        points: the hook points to attach (default: every one of :data:`HOOK_POINTS` the
            engine's config names).
        layers: the layers to attach at (default: all).
        layout: where the hook points are, for a model_type without a :data:`LAYOUTS` entry.
        hooks: a :class:`SteeringHooks` to attach (default: one built from handle and
            ``hook_options``, e.g. ``force_device_path=True``); closed by :meth:`close` either way.

    Raises:
        UnsupportedModelError, HiddenSizeError (the engine's hidden size is not the model's),
        LayerRangeError (the engine has another number of layers), UnknownHookError (a point
        the engine's config does not name).
    """

    def __init__(self, model: torch.nn.Module, handle: _Handle, points: Optional[Sequence[str]] = None,
                 layers: Optional[Sequence[int]] = None, *, layout: Optional[Layout] = None,
                 hooks: Optional[SteeringHooks] = None, **hook_options: Any) -> None:
        blocks = decoder_blocks(model, layout)
        hidden, n_layers, names = handle.model
        width = getattr(getattr(model, "config", None), "hidden_size", hidden)
        if width != hidden:
            raise HiddenSizeError(f"shmsteer.hf: the model's hidden size is {width}, the engine's {hidden}")
        if len(blocks) != n_layers:
            raise LayerRangeError(f"shmsteer.hf: the model has {len(blocks)} decoder layers, the engine {n_layers}")
        if points is None:
            points = [p for p in HOOK_POINTS if p in names]
        for p in points:
            if p not in HOOK_POINTS or p not in names:
                raise UnknownHookError(f"shmsteer.hf: hook point {p!r}: attachable are {[h for h in HOOK_POINTS if h in names]}")
        at = list(range(n_layers) if layers is None else layers)
        for i in at:
            if not 0 <= i < n_layers:
                raise LayerRangeError(f"shmsteer.hf: layer {i}, the model has {n_layers}")
        self.model = model
        self.hooks = hooks if hooks is not None else SteeringHooks(handle, **hook_options)
        self.points: Tuple[str, ...] = tuple(points)
        self._handles: List[Any] = []
        self._batch: Optional[_Requests] = None
        self._version = 0
        self._open = False  # a forward's step is open
        self._step: Optional[Any] = None  # its context manager (None in static mode)
        self._rows = np.zeros(0, dtype=np.int64)  # the open step's real tokens per batch row
        for i in at:
            self._attach_layer(blocks[i], i)
        self._handles.append(model.register_forward_pre_hook(self._begin, with_kwargs=True))
        self._handles.append(model.register_forward_hook(self._end, always_call=True))

    def _attach_layer(self, b: Block, i: int) -> None:
        for p in self.points:
            if p in ("pre_attn", "post_attn"):  # the norm's input: the residual stream, in place
                self.hooks.attach(b.attn_norm if p == "pre_attn" else b.mlp_norm, p, i, input=True)
            else:
                self.hooks.attach({"mlp_in": b.mlp_norm, "mlp_out": b.mlp_out, "post_block": b.layer}[p], p, i)

    # ---- per forward ------------------------------------------------------------------------

    def _begin(self, _mod: torch.nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        x = kwargs.get("input_ids")
        if x is None:
            x = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs.get("inputs_embeds")
        if x is None or x.dim() < 2:
            raise RequestBatchError("shmsteer.hf: the forward has no [batch, seq] input_ids or inputs_embeds")
        b, s = int(x.shape[0]), int(x.shape[1])
        if self._open:  # a forward whose end hook did not run: close its step
            self._close_step()
        spans: Any
        if self._batch is not None:
            spans, rows = self._batch.forward_spans(b, s, kwargs.get("attention_mask"))
        else:
            spans, rows = [], np.zeros(b, dtype=np.int64)
        step = None
        if self.hooks.static:  # CUDA graphs, torch.compile: the forward only reads static buffers
            self.hooks.prepare(spans, version=self._version)
        else:
            step = self.hooks.step(spans, version=self._version, rows=b * s)
            step.__enter__()
        self._open, self._step, self._rows = True, step, rows

    def _end(self, _mod: torch.nn.Module, _args: Any, _out: Any) -> None:
        if not self._open:
            return
        self._close_step()
        if self._batch is not None:
            self._batch.seen += self._rows

    def _close_step(self) -> None:
        step, self._step, self._open = self._step, None, False
        if step is not None:
            step.__exit__(None, None, None)
        else:
            self.hooks.report()  # static: the step's gate scores and captured rows

    # ---- the requests ----------------------------------------------------------------------

    @contextlib.contextmanager
    def requests(self, request_ids: Sequence[Optional[str]], prompt_lens: Optional[Sequence[int]] = None,
                 version: int = 0) -> Iterator["HFSteering"]:
        """Steer the forwards run inside as this batch of requests, one a row (None: a row no
        request owns). ``version``: the region version every step pins (0: the current one at
        each step). ``prompt_lens``: each row's prompt length (default: its real tokens in the
        first forward)."""
        if self._batch is not None:
            raise RuntimeError("shmsteer.hf: requests() is already open on this model")
        self._batch, self._version = _Requests(request_ids, prompt_lens), version
        try:
            yield self
        finally:
            if self._open:
                self._close_step()
            self._batch, self._version = None, 0

    def generate(self, request_ids: Sequence[Optional[str]], input_ids: Optional[torch.Tensor] = None, *,
                 prompt_lens: Optional[Sequence[int]] = None, version: int = 0, **kwargs: Any) -> Any:
        """``model.generate(input_ids, **kwargs)`` steered as the batch ``request_ids`` (see
        :meth:`requests`). Returns what ``generate`` returns."""
        with self.requests(request_ids, prompt_lens, version):
            return self.model.generate(input_ids=input_ids, **kwargs)  # type: ignore[operator]

    @staticmethod
    def prompt_lens(attention_mask: torch.Tensor) -> List[int]:
        """Each row's prompt length (its real tokens): ``prompt_len=`` for ``Owner.admit``."""
        return [int(n) for n in attention_mask.sum(dim=-1).tolist()]

    def close(self) -> None:
        """Remove every hook and close the steering hooks (their stepper and batch)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.hooks.close()

    def __enter__(self) -> "HFSteering":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["HFSteering", "Layout", "LAYOUTS", "HOOK_POINTS", "Block", "decoder_blocks", "find_layout",
           "UnsupportedModelError", "RequestBatchError"]
