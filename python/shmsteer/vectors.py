"""Steering vectors from PyTorch ``.pt`` files (what EasySteer-style tools save).

GGUF control vectors, ``.npy``/``.npz`` and safetensors are read by the Go importer
(``steer/vecfile``) through the C ABI: :meth:`shmsteer.Client.import_vector`. This module
reads (and :func:`save_pt` writes) the one format the Go side cannot, ``torch.save`` files,
and reads them only with
``torch.load(path, map_location="cpu", weights_only=True)``: the restricted unpickler builds
tensors, dicts, lists and numbers and refuses every other global, so no arbitrary object is
ever unpickled and nothing in the file is executed. A file it refuses (a pickled object, not a
tensor file) raises :class:`NotWeightsOnlyError`.

Accepted layouts (the names follow ``steer/vecfile``'s safetensors names):

- a tensor ``[layers, hidden]`` (row L steers layer L) or ``[hidden]`` (one vector, applied to
  every layer of ``layer_range``, which is then required), at ``hook``;
- a dict ``{"layers.N": [hidden]}`` (repeng / EasySteer style: ``hook`` at layer N, by default
  post_block, the block output llama.cpp's control vectors steer);
- a dict ``{"<hook>": [layers, hidden]}`` (one array per hook, as an .npz);
- a dict ``{"<hook>.N": [hidden]}`` or ``{"layers.N.<hook>": [hidden]}``.

A ``[1, hidden]`` tensor counts as ``[hidden]`` where one vector is expected. float16, bfloat16,
float32 and float64 are converted to float32; ``scale`` is multiplied in float32 (as llama.cpp
does at load). Rows that are all zero steer nothing and are dropped. Errors are ValueError
subclasses of :mod:`shmsteer.errors` that name the file, the tensor and the expected shape.
"""

from __future__ import annotations

import inspect
import os
import pickle
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .errors import (DtypeError, DuplicateError, HiddenSizeError, LayerRangeError, NeedLayersError,
                     NonFiniteError, NoVectorsError, TensorNameError, UnknownHookError,
                     ValueRangeError, VectorFileCorruptError, VectorFileOptionsError,
                     VectorFileShapeError, VectorFileTooLargeError)

#: The hooks of a model whose owner named none (steer's defaults).
DEFAULT_HOOKS: Tuple[str, ...] = ("pre_attn", "post_attn", "post_block", "mlp_in", "mlp_out")
#: The hook GGUF control vectors, plain arrays and ``layers.N`` tensors steer by default.
DEFAULT_HOOK = "post_block"
#: The size cap (bytes) when ``max_bytes`` is 0, as steer/vecfile's.
DEFAULT_MAX_BYTES = 4 << 30
#: File extensions read by :func:`load_pt` (every other format goes to the Go importer).
PT_EXTENSIONS = (".pt", ".pth")

LayerRange = Union[None, str, int, Tuple[int, int]]
Entry = Tuple[str, int, np.ndarray]

_LAYER_N = re.compile(r"^layers\.(0|[1-9][0-9]*)$")
_HOOK_N = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\.(0|[1-9][0-9]*)$")
_LAYER_N_HOOK = re.compile(r"^layers\.(0|[1-9][0-9]*)\.([A-Za-z_][A-Za-z0-9_]*)$")
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class NotWeightsOnlyError(VectorFileCorruptError):
    """The file is not a weights-only PyTorch tensor file: ``torch.load(weights_only=True)``
    refused it (a pickled object, a corrupt archive). Nothing in it was executed."""


def parse_layer_range(layer_range: LayerRange) -> Optional[Tuple[int, int]]:
    """``"A-B"``, ``"A"``, ``A`` or ``(A, B)`` as an inclusive (first, last) pair; None keeps
    every layer. Raises VectorFileOptionsError for a negative or reversed range."""
    if layer_range is None:
        return None
    try:
        if isinstance(layer_range, str):
            a, sep, b = layer_range.strip().partition("-")
            first = int(a)
            last = int(b) if sep else first
        elif isinstance(layer_range, int):
            first = last = layer_range
        else:
            first, last = (int(x) for x in layer_range)
    except (TypeError, ValueError):
        raise VectorFileOptionsError(
            f"shmsteer: bad vector file options: layer range {layer_range!r}: want 'A-B', 'A' or (A, B)") from None
    if first < 0 or first > last:
        raise VectorFileOptionsError(
            f"shmsteer: bad vector file options: layer range {first}-{last}: want 0 <= A <= B")
    return first, last


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only where torch is missing
        raise ImportError(f"shmsteer: reading .pt files needs torch (apt-get install python3-torch): {e}") from e
    if "weights_only" not in inspect.signature(torch.load).parameters:  # pragma: no cover
        raise ImportError(f"shmsteer: torch {torch.__version__} has no torch.load(weights_only=True) "
                          "(torch >= 1.13 needed); refusing to unpickle a .pt file without it")
    return torch


class _Loader:
    """One load_pt call: the model's shape, the options, and the entries read so far."""

    def __init__(self, path: str, hidden: int, layers: int, hook: str, scale: float,
                 layer_range: Optional[Tuple[int, int]], hooks: Sequence[str]) -> None:
        self.path, self.hidden, self.layers = path, hidden, layers
        self.hook, self.scale, self.range, self.hooks = hook, np.float32(scale), layer_range, list(hooks)
        self.out: Dict[Tuple[str, int], np.ndarray] = {}

    def where(self, tensor: str) -> str:
        return f"{self.path}: tensor {tensor!r}"

    def check_hook(self, tensor: str, hook: str) -> None:
        if hook not in self.hooks:
            raise UnknownHookError(f"shmsteer: unknown hook: {self.where(tensor)}: hook {hook!r}, "
                                   f"the model has {', '.join(self.hooks)}")

    def floats(self, tensor: str, value: Any) -> np.ndarray:
        """value as a float64 numpy array (exact for every accepted dtype), dtype checked."""
        torch = _torch()
        if not isinstance(value, torch.Tensor):
            raise VectorFileCorruptError(
                f"shmsteer: corrupt or truncated vector file: {self.where(tensor)}: a {type(value).__name__}, "
                f"want a tensor of shape [{self.layers}, {self.hidden}] or [{self.hidden}]")
        if value.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise DtypeError(f"shmsteer: unsupported tensor dtype: {self.where(tensor)}: {value.dtype}, "
                             "want float16, bfloat16, float32 or float64")
        t = value.detach().to("cpu")
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds it exactly
            t = t.to(torch.float32)
        return t.numpy().astype(np.float64)

    def add(self, tensor: str, hook: str, layer: int, row: np.ndarray) -> None:
        """Check and store one [hidden] row at (hook, layer)."""
        if row.shape != (self.hidden,):
            raise HiddenSizeError(f"shmsteer: tensor shape does not fit the model: {self.where(tensor)}: "
                                  f"shape {list(row.shape)}, want [{self.hidden}] (the model's hidden size)")
        if self.range is not None and not (self.range[0] <= layer <= self.range[1]):
            return
        if not 0 <= layer < self.layers:
            raise LayerRangeError(f"shmsteer: layer out of range: {self.where(tensor)}: layer {layer}, "
                                  f"the model has layers 0..{self.layers - 1}")
        bad = np.flatnonzero(~np.isfinite(row))
        if bad.size:
            raise NonFiniteError(f"shmsteer: non-finite value: {self.where(tensor)}: element {bad[0]} "
                                 f"is {row[bad[0]]}")
        big = np.flatnonzero(np.abs(row) > _FLOAT32_MAX)
        if big.size:
            raise ValueRangeError(f"shmsteer: value does not fit float32: {self.where(tensor)}: "
                                  f"element {big[0]} is {row[big[0]]}")
        with np.errstate(over="ignore"):
            data = row.astype(np.float32)
            if self.scale != 1:
                data = data * self.scale
        bad = np.flatnonzero(~np.isfinite(data))
        if bad.size:
            raise NonFiniteError(f"shmsteer: non-finite value: {self.where(tensor)}: element {bad[0]} "
                                 f"overflows float32 after scale {self.scale}")
        if (hook, layer) in self.out:
            raise DuplicateError(f"shmsteer: duplicate: {self.where(tensor)}: {hook} layer {layer} given twice")
        if np.any(data):  # an all-zero row steers nothing
            self.out[(hook, layer)] = np.ascontiguousarray(data, dtype=np.float32)

    def array(self, tensor: str, hook: str, value: Any) -> None:
        """A [layers, hidden] array (row L at layer L) or a [hidden] one (every layer of the range)."""
        a = self.floats(tensor, value)
        if a.ndim == 2 and a.shape[1] == self.hidden and a.shape[0] == self.layers:
            for layer in range(self.layers):
                self.add(tensor, hook, layer, a[layer])
            return
        if a.ndim == 1 or (a.ndim == 2 and a.shape[0] == 1):
            row = a.reshape(-1)
            if self.range is None:
                raise NeedLayersError(f"shmsteer: a [hidden] array needs a layer range: {self.where(tensor)}: "
                                      f"shape {list(a.shape)}: pass layer_range (layers='A-B') or save "
                                      f"[{self.layers}, {self.hidden}]")
            for layer in range(self.range[0], min(self.range[1], self.layers - 1) + 1):
                self.add(tensor, hook, layer, row)
            return
        if a.ndim == 2 and a.shape[1] != self.hidden:
            raise HiddenSizeError(f"shmsteer: tensor shape does not fit the model: {self.where(tensor)}: "
                                  f"shape {list(a.shape)}, want [{self.layers}, {self.hidden}] or [{self.hidden}]")
        raise VectorFileShapeError(f"shmsteer: tensor shape does not fit the model: {self.where(tensor)}: "
                                   f"shape {list(a.shape)}, want [{self.layers}, {self.hidden}] or [{self.hidden}]")

    def one(self, tensor: str, hook: str, layer: int, value: Any) -> None:
        """A single vector, [hidden] or [1, hidden]."""
        a = self.floats(tensor, value)
        if a.ndim == 2 and a.shape[0] == 1:
            a = a.reshape(-1)
        if a.ndim != 1:
            raise VectorFileShapeError(f"shmsteer: tensor shape does not fit the model: {self.where(tensor)}: "
                                       f"shape {list(a.shape)}, want [{self.hidden}]")
        self.add(tensor, hook, layer, a)

    def entry(self, key: Any, value: Any) -> None:
        """One item of a dict file, dispatched on its name."""
        if not isinstance(key, str):
            raise TensorNameError(f"shmsteer: tensor name does not name a hook and layer: {self.path}: "
                                  f"key {key!r} is not a string")
        m = _LAYER_N.match(key)
        if m:
            self.one(key, self.hook, int(m.group(1)), value)
            return
        m = _LAYER_N_HOOK.match(key)
        if m:
            self.check_hook(key, m.group(2))
            self.one(key, m.group(2), int(m.group(1)), value)
            return
        m = _HOOK_N.match(key)
        if m and m.group(1) in self.hooks:
            self.one(key, m.group(1), int(m.group(2)), value)
            return
        if key in self.hooks:
            self.array(key, key, value)
            return
        raise TensorNameError(f"shmsteer: tensor name does not name a hook and layer: {self.where(key)}: "
                              f"want layers.N ({self.hook}), <hook>.N, layers.N.<hook> or <hook> "
                              f"([{self.layers}, {self.hidden}]) with a hook of {', '.join(self.hooks)}")

    def result(self) -> List[Entry]:
        if not self.out:
            raise NoVectorsError(f"shmsteer: vector file steers nothing: {self.path}"
                                 + (f" (layer range {self.range[0]}-{self.range[1]})" if self.range else ""))
        order = {h: i for i, h in enumerate(self.hooks)}
        keys = sorted(self.out, key=lambda k: (order[k[0]], k[1]))
        return [(h, layer, self.out[(h, layer)]) for h, layer in keys]


def load_pt(path: Union[str, os.PathLike], hidden: int, layers: int, hook: str = DEFAULT_HOOK,
            scale: float = 1.0, layer_range: LayerRange = None, *,
            hooks: Sequence[str] = DEFAULT_HOOKS, max_bytes: int = 0) -> List[Entry]:
    """Read the steering vectors of a ``torch.save`` file for a model of ``hidden`` x ``layers``.

    Args:
        path: the .pt file.
        hidden, layers: the model's hidden size and number of layers.
        hook: the hook a plain tensor and ``layers.N`` entries steer (default post_block).
        scale: multiplies every value (float32), as llama.cpp's ``--control-vector-scaled``.
        layer_range: keep only layers A..B inclusive (``"A-B"``, ``(A, B)``, ``A``); required
            for a single ``[hidden]`` tensor, which is applied to each of those layers.
        hooks: the model's hook names (``Client.model[2]``; default steer's five).
        max_bytes: size cap checked before the file is read (0: 4 GiB).

    Returns:
        ``[(hook, layer, float32 array of hidden)]`` sorted by (hook order, layer), ready for
        ``register_vector`` (at scale 1: ``scale`` is already multiplied in).

    Raises:
        NotWeightsOnlyError: not a weights-only tensor file (nothing was executed).
        HiddenSizeError, VectorFileShapeError, LayerRangeError, NonFiniteError, DtypeError,
        TensorNameError, UnknownHookError, DuplicateError, NeedLayersError, NoVectorsError,
        VectorFileTooLargeError, VectorFileOptionsError: all ValueError subclasses naming the
        file, the tensor and the expected shape.
        OSError: the file cannot be read.
    """
    path = os.fspath(path)
    if hidden < 1 or layers < 1:
        raise VectorFileOptionsError(f"shmsteer: bad vector file options: hidden {hidden}, layers {layers}: want >= 1")
    if not np.isfinite(scale) or abs(scale) > _FLOAT32_MAX or np.float32(scale) == 0:
        raise VectorFileOptionsError(f"shmsteer: bad vector file options: scale {scale}: want a finite, "
                                     "non-zero float32")
    if hook not in hooks:
        raise UnknownHookError(f"shmsteer: unknown hook: {hook!r}, the model has {', '.join(hooks)}")
    rng = parse_layer_range(layer_range)
    cap = max_bytes if max_bytes > 0 else DEFAULT_MAX_BYTES
    size = os.stat(path).st_size
    if size > cap:
        raise VectorFileTooLargeError(f"shmsteer: vector file larger than the size cap: {path} is {size} bytes, "
                                      f"the cap is {cap} (max_bytes)")
    torch = _torch()
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise NotWeightsOnlyError(
            f"shmsteer: corrupt or truncated vector file: {path} is not a weights-only PyTorch tensor file: "
            f"torch.load(weights_only=True) refused it, nothing in it was executed ({str(e)[-200:]})") from None
    except OSError:
        raise
    except Exception as e:  # a corrupt archive: torch raises RuntimeError, EOFError, ...
        raise NotWeightsOnlyError(
            f"shmsteer: corrupt or truncated vector file: {path}: torch.load(weights_only=True) failed: "
            f"{type(e).__name__}: {str(e)[:200]}") from None
    ld = _Loader(path, hidden, layers, hook, float(scale), rng, hooks)
    if isinstance(obj, dict):
        for key, value in obj.items():
            ld.entry(key, value)
    else:
        ld.array("<tensor>", hook, obj)
    return ld.result()


def save_pt(path: Union[str, os.PathLike], entries: Sequence[Tuple[str, int, float, Any]]) -> None:
    """Write (hook, layer, scale, float32 data) entries with ``torch.save`` as a dict
    ``{"<hook>.<layer>": float32 tensor [hidden]}`` (scale multiplied in, in float32, as
    steer/vecfile's export does; nothing is multiplied at scale 1, so :func:`load_pt` gives back
    the same floats bitwise). On error the partial file is removed."""
    torch = _torch()
    out: Dict[str, Any] = {}
    for hook, layer, scale, data in entries:
        a = np.array(data, dtype=np.float32)  # a copy: data may be a view of the mapping
        if scale != 1:
            a = a * np.float32(scale)
        out[f"{hook}.{layer}"] = torch.from_numpy(a)
    path = os.fspath(path)
    try:
        torch.save(out, path)
    except BaseException:
        if os.path.exists(path):
            os.remove(path)
        raise


def is_pt(path: Union[str, os.PathLike], format: Optional[str] = None) -> bool:
    """Whether :meth:`shmsteer.Client.import_vector` reads ``path`` with :func:`load_pt`: format
    ``"pt"``, or no format and a ``.pt``/``.pth`` extension (a torch.save file is a zip
    archive, like an .npz: the extension tells them apart)."""
    if format is not None:
        return format == "pt"
    return os.fspath(path).lower().endswith(PT_EXTENSIONS)


__all__ = ["load_pt", "save_pt", "is_pt", "parse_layer_range", "NotWeightsOnlyError", "DEFAULT_HOOKS",
           "DEFAULT_HOOK", "DEFAULT_MAX_BYTES", "PT_EXTENSIONS"]
