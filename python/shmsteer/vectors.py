"""Steering vectors from PyTorch ``.pt`` files (what EasySteer-style tools save).

GGUF control vectors, ``.npy``/``.npz`` and safetensors are read by the Go importer
(``steer/vecfile``) through the C ABI: :meth:`shmsteer.Client.import_vector`. A ``torch.save``
file is the one format the Go side cannot read: this module unpickles it, only ever with
``torch.load(path, map_location="cpu", weights_only=True)`` (the restricted unpickler builds
tensors, dicts, lists and numbers and refuses every other global, so no arbitrary object is
ever unpickled and nothing in the file is executed), and hands its tensors to the same Go
importer as bytes (:func:`pt_to_bytes`, then ``shmsteer_vector_import_bytes``): a dict of
tensors as a safetensors file with the same names, a single tensor as an ``.npy``. Every rule
(tensor names, hooks, shapes, layer ranges, dtypes, scale, the size cap) is the importer's,
documented in the Go package ``steer/vecfile``; a file torch refuses raises
:class:`NotWeightsOnlyError`. :func:`save_pt` writes a named vector back as a ``.pt``.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import pickle
import struct
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .errors import DtypeError, TensorNameError, VectorFileCorruptError

#: File extensions read as ``torch.save`` files (every other format goes to the Go importer).
PT_EXTENSIONS = (".pt", ".pth")


class NotWeightsOnlyError(VectorFileCorruptError):
    """The file is not a weights-only PyTorch tensor file: ``torch.load(weights_only=True)``
    refused it (a pickled object, a corrupt archive). Nothing in it was executed."""


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only where torch is missing
        raise ImportError(f"shmsteer: reading .pt files needs torch (apt-get install python3-torch): {e}") from e
    if "weights_only" not in inspect.signature(torch.load).parameters:  # pragma: no cover
        raise ImportError(f"shmsteer: torch {torch.__version__} has no torch.load(weights_only=True) "
                          "(torch >= 1.13 needed); refusing to unpickle a .pt file without it")
    return torch


def _load_weights_only(path: str) -> Any:
    torch = _torch()
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
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


def _safetensors_dtypes(torch: Any) -> Dict[Any, str]:
    """torch dtype -> safetensors dtype name, for every dtype both know (the importer says which
    it converts)."""
    names = {"float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64", "int8": "I8",
             "uint8": "U8", "int16": "I16", "int32": "I32", "int64": "I64", "bool": "BOOL",
             "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}
    return {getattr(torch, n): st for n, st in names.items() if hasattr(torch, n)}


def _tensor(path: str, name: str, value: Any, torch: Any) -> Any:
    """value as a contiguous CPU tensor, or the error naming what it is instead."""
    if not isinstance(value, torch.Tensor):
        raise VectorFileCorruptError(
            f"shmsteer: corrupt or truncated vector file: {path}: tensor {json.dumps(name)}: a {type(value).__name__}, "
            "want a tensor")
    return value.detach().to("cpu").contiguous()


def _raw(t: Any, torch: Any) -> bytes:
    """The little-endian bytes of a contiguous CPU tensor."""
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: the same 2 bytes as int16
        t = t.view(torch.int16)
    a = t.numpy()
    return a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()


def _safetensors(path: str, obj: Dict[Any, Any], torch: Any) -> bytes:
    """A dict of tensors as safetensors bytes, under the same names."""
    dtypes = _safetensors_dtypes(torch)
    header: Dict[str, Any] = {}
    chunks: List[bytes] = []
    offset = 0
    for key, value in obj.items():
        if not isinstance(key, str):
            raise TensorNameError(f"shmsteer: tensor name does not name a hook and layer: {path}: "
                                  f"key {key!r} is not a string")
        t = _tensor(path, key, value, torch)
        st = dtypes.get(t.dtype)
        if st is None:
            raise DtypeError(f"shmsteer: unsupported tensor dtype: {path}: tensor {json.dumps(key)}: {t.dtype}")
        raw = _raw(t, torch)
        header[key] = {"dtype": st, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js + b"".join(chunks)


def _npy(path: str, obj: Any, torch: Any) -> bytes:
    """A single tensor as .npy bytes (bfloat16 widened to float32, which holds it exactly)."""
    t = _tensor(path, "<tensor>", obj, torch)
    if t.dtype == torch.bfloat16:
        t = t.to(torch.float32)
    try:
        a = t.numpy()
    except TypeError:  # a dtype numpy lacks (float8, complex32, ...)
        raise DtypeError(f"shmsteer: unsupported tensor dtype: {path}: {t.dtype}") from None
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def pt_to_bytes(path: Union[str, os.PathLike]) -> Tuple[bytes, str]:
    """Read a ``torch.save`` file with ``torch.load(weights_only=True)`` and return its tensors
    as bytes the Go importer reads, and their format: a dict ``{name: tensor}`` as
    ``"safetensors"`` (the same names: ``layers.N``, ``<hook>.N``, ``layers.N.<hook>``,
    ``<hook>``), a single tensor as ``"npy"``. The bytes are checked by the importer
    (``shmsteer_vector_import_bytes``), not here.

    Raises:
        NotWeightsOnlyError: not a weights-only tensor file (nothing was executed).
        VectorFileCorruptError: a value that is not a tensor; TensorNameError: a key that is
            not a string; DtypeError: a dtype the formats cannot hold.
        OSError: the file cannot be read.
    """
    path = os.fspath(path)
    obj = _load_weights_only(path)
    torch = _torch()
    if isinstance(obj, dict):
        return _safetensors(path, obj, torch), "safetensors"
    return _npy(path, obj, torch), "npy"


def save_pt(path: Union[str, os.PathLike], entries: Sequence[Tuple[str, int, float, Any]]) -> None:
    """Write (hook, layer, scale, float32 data) entries with ``torch.save`` as a dict
    ``{"<hook>.<layer>": float32 tensor [hidden]}`` (scale multiplied in, in float32, as
    steer/vecfile's export does; nothing is multiplied at scale 1, so importing it gives back
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
    """Whether :meth:`shmsteer.Client.import_vector` reads ``path`` as a ``torch.save`` file:
    format ``"pt"``, or no format and a ``.pt``/``.pth`` extension (a torch.save file is a zip
    archive, like an .npz: the extension tells them apart)."""
    if format is not None:
        return format == "pt"
    return os.fspath(path).lower().endswith(PT_EXTENSIONS)


__all__ = ["pt_to_bytes", "save_pt", "is_pt", "NotWeightsOnlyError", "PT_EXTENSIONS"]
