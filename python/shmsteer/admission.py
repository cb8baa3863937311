"""Binary admission: an override's inline vectors and clamps passed to the engine as float32 buffers.

:meth:`shmsteer.Owner.admit` takes an override in the engine's steering JSON shape. A vector
whose ``data`` is a float list goes as JSON, as before; one whose ``data`` is a numpy array, a
torch tensor or another buffer of numbers goes by address through
``shmsteer_request_admit_binary``: no float list is built, no float is printed or parsed, and
the engine copies the floats once. A 32-layer x 4096 override is 512 KiB as float32 and about
2.7 MB as JSON text.

The buffer of a vector must be 1-D with the model's hidden size; float32 C-contiguous CPU memory
is used in place, anything else (float64, float16, bfloat16, a strided view, a CUDA tensor)
is converted to it first (numpy's and torch's rounding: nearest, ties to even). Bool, complex
and object data are refused (:class:`~shmsteer.errors.InvalidArgumentError`), as are keys other
than ``hook``, ``layer``, ``scale`` and ``data`` (the JSON's rule). A vector's hook is a name
(or an id), its layer an integer, its scale a number (left out: 0, as in the JSON).

A tier's clamps go by address too (``shmsteer_request_admit_buffers``), all of them or none, since
a tier's clamps apply in order: when every clamp of the tier has exactly the keys ``hook``,
``layer``, ``dir``, ``min``, ``max`` and ``strength`` (``strength`` may be left out: 0, as in the
JSON), numbers for the last three and a direction that is a buffer or a list of ints and floats
(the form :func:`shmsteer.openai.admission_from_request` gives). A list direction is converted
to float32 from its float64 values (to nearest, ties to even); a 1024-float direction costs
about 2 ms as JSON text printed and parsed. Any other tier stays in the JSON, for the engine
to judge as before.
"""

from __future__ import annotations

import ctypes
import numbers
from ctypes import POINTER, c_float
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from . import _lib
from .errors import HiddenSizeError, InvalidArgumentError

try:  # numpy is optional: without it only torch tensors (and float lists) are taken
    import numpy as _np
except ImportError:  # pragma: no cover - exercised only where numpy is missing
    _np = None

#: An override tier's name -> its SHMSTEER_TIER_* value.
TIERS = {"base": _lib.TIER_BASE, "prefill": _lib.TIER_PREFILL, "decode": _lib.TIER_DECODE}

_KEYS = frozenset(("hook", "layer", "scale", "data"))
_F32 = _np.dtype(_np.float32) if _np is not None else None


def _rec_dtype() -> Any:
    """The numpy dtype laid out as shmsteer_admit_vector (AdmitVectorC): offsets from ctypes."""
    if _np is None:  # pragma: no cover - exercised only where numpy is missing
        return None
    S = _lib.AdmitVectorC
    kinds = {"tier": "<u4", "hook": "<u4", "layer": "<i4", "scale": "<f4", "data": _np.uintp, "len": _np.uintp}
    return _np.dtype({"names": list(kinds), "formats": list(kinds.values()),
                      "offsets": [getattr(S, n).offset for n in kinds], "itemsize": ctypes.sizeof(S)})


_REC = _rec_dtype()
_I32 = (-(1 << 31), (1 << 31) - 1)


def _bad(msg: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"shmsteer: invalid argument: {msg}")


def _is_list(data: Any) -> bool:
    return isinstance(data, (list, tuple))


def _torch_buffer(where: str, t: Any) -> Tuple[int, int, Any]:
    """(address, floats, owner) of a torch tensor as 1-D float32 contiguous CPU memory."""
    if t.dim() != 1:
        raise _bad(f"{where}: data must be 1-D (the hidden size), got shape {tuple(t.shape)}")
    if t.dtype.is_complex or not (t.dtype.is_floating_point or t.dtype in _torch_ints()):
        raise _bad(f"{where}: data must be real numbers, got {t.dtype}")
    t = t.detach()
    if t.device.type != "cpu" or t.dtype != _torch().float32:
        t = t.to(device="cpu", dtype=_torch().float32)
    t = t.contiguous()
    return t.data_ptr(), t.numel(), t


def _torch() -> Any:
    import torch
    return torch


def _torch_ints() -> Tuple[Any, ...]:
    torch = _torch()
    return (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def _is_tensor(data: Any) -> bool:
    mod = type(data).__module__
    return mod.startswith("torch") and hasattr(data, "data_ptr") and hasattr(data, "dim")


def _buffer(where: str, data: Any) -> Tuple[int, int, Any]:
    """(address, floats, owner) of ``data`` as 1-D float32 C-contiguous memory: the caller keeps
    ``owner`` alive until the engine has read it."""
    if _np is not None and type(data) is _np.ndarray and data.dtype == _F32 and data.ndim == 1 \
            and data.flags.c_contiguous:  # the common case, used in place
        return data.ctypes.data, data.size, data
    if _is_tensor(data):
        return _torch_buffer(where, data)
    if _np is None:
        raise _bad(f"{where}: data must be a float list or a torch tensor (numpy is not installed)")
    try:
        a = _np.asarray(data)
    except (TypeError, ValueError) as e:
        raise _bad(f"{where}: data is not an array of numbers: {e}") from None
    if a.dtype.kind not in "fiu":
        raise _bad(f"{where}: data must be real numbers, got dtype {a.dtype}")
    if a.ndim != 1:
        raise _bad(f"{where}: data must be 1-D (the hidden size), got shape {a.shape}")
    a = _np.ascontiguousarray(a, dtype=_np.float32)
    return a.ctypes.data, a.size, a


def _vector(where: str, v: Any, tier: int, hook_id: Callable[[Union[str, int]], int], hidden: int,
            keep: List[Any]) -> Tuple[int, int, int, float, int, int]:
    """The shmsteer_admit_vector fields (tier, hook, layer, scale, data address, len) of the
    vector dict ``v`` of an override tier; the object owning its floats goes to ``keep``."""
    if not _KEYS.issuperset(v):
        raise _bad(f"{where}: unknown keys {sorted(set(v) - _KEYS)} (a vector has hook, layer, scale, data)")
    layer, scale = v.get("layer", 0), v.get("scale", 0.0)
    if type(layer) is not int and (isinstance(layer, bool) or not isinstance(layer, numbers.Integral)) \
            or not _I32[0] <= int(layer) <= _I32[1]:
        raise _bad(f"{where}: layer must be a 32-bit integer, got {layer!r}")
    if type(scale) is not float and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        raise _bad(f"{where}: scale must be a number, got {type(scale).__name__}")
    ptr, n, owner = _buffer(where, v.get("data"))
    if n != hidden:
        raise HiddenSizeError(f"shmsteer: vector length is not the hidden size: {where} has {n} floats, "
                              f"hidden size is {hidden}")
    keep.append(owner)
    return tier, hook_id(v.get("hook", "")), int(layer), float(scale), ptr, n


def _records(fields: List[Tuple[int, int, int, float, int, int]]) -> ctypes.Array:
    """A shmsteer_admit_vector array of ``fields``: filled in one numpy assignment (setting
    ctypes fields one by one costs more than the rest of an admission's Python side)."""
    arr = (_lib.AdmitVectorC * len(fields))()
    if _REC is not None:
        _np.frombuffer(arr, dtype=_REC)[:] = fields
        return arr
    for e, (tier, hook, layer, scale, ptr, n) in zip(arr, fields):  # pragma: no cover - without numpy
        e.tier, e.hook, e.layer, e.scale, e.data, e.len = tier, hook, layer, scale, ctypes.cast(ptr, POINTER(c_float)), n
    return arr


def split_override(override: Any, hook_id: Callable[[Union[str, int]], int], hidden: int
                   ) -> Tuple[Any, Optional[ctypes.Array], List[Any]]:
    """Take the buffer vectors out of ``override``: (the override left for the JSON, the
    shmsteer_admit_vector array of the taken ones or None, the objects owning their memory).
    ``hook_id`` maps a hook name to its id; ``hidden`` is the model's hidden size.

    ``override`` itself is not changed. Anything that is not the shape the engine reads (not a
    dict, a tier that is not a dict, vectors that are not a list) is left in the JSON for the
    engine to judge."""
    if not isinstance(override, dict):
        return override, None, []
    taken: List[Tuple[str, int, Dict[str, Any]]] = []
    rest = dict(override)
    for name, tier in TIERS.items():
        t = override.get(name)
        if not isinstance(t, dict) or not isinstance(t.get("vectors"), list):
            continue
        vecs = t["vectors"]
        binary = [i for i, v in enumerate(vecs) if isinstance(v, dict) and "data" in v and not _is_list(v["data"])]
        if not binary:
            continue
        moved = set(binary)
        rest[name] = dict(t, vectors=[v for i, v in enumerate(vecs) if i not in moved])
        taken += [(f"override {name} vector {i}", tier, vecs[i]) for i in binary]
    if not taken:
        return override, None, []
    keep: List[Any] = []
    fields = [_vector(where, v, tier, hook_id, hidden, keep) for where, tier, v in taken]
    return rest, _records(fields), keep


_CLAMP_KEYS = frozenset(("hook", "layer", "dir", "min", "max", "strength"))
_NUMBERS = frozenset((int, float))


def _plain_number(x: Any) -> bool:
    return type(x) in _NUMBERS or (isinstance(x, numbers.Real) and not isinstance(x, bool))


def _clamp_dir(where: str, d: Any) -> Optional[Tuple[int, int, Any]]:
    """(address, floats, owner) of a clamp direction as float32, or None when it should stay in
    the JSON (a list with anything but ints and floats, or beyond float64)."""
    if _is_list(d):
        if not set(map(type, d)) <= _NUMBERS:
            return None
        try:
            a = _np.array(d, dtype=_np.float64)
        except (OverflowError, ValueError, TypeError):
            return None
        with _np.errstate(over="ignore"):  # beyond float32: inf, refused by the engine as non-finite
            a = a.astype(_np.float32)
        return a.ctypes.data, a.size, a
    return _buffer(where, d)


def _clamp_fields(where: str, c: Any, hook_id: Callable[[Union[str, int]], int], hidden: int,
                  keep: List[Any]) -> Optional[Tuple[int, int, float, float, float, int, int]]:
    """The shmsteer_admit_clamp fields (hook, layer, min, max, strength, dir address, len) of the
    clamp dict ``c``, or None when it is not the plain form (it then stays in the JSON)."""
    if not isinstance(c, dict) or not _CLAMP_KEYS.issuperset(c) or "dir" not in c or "min" not in c \
            or "max" not in c:
        return None
    layer, lo, hi, strength = c.get("layer", 0), c["min"], c["max"], c.get("strength", 0.0)
    if type(layer) is not int and (isinstance(layer, bool) or not isinstance(layer, numbers.Integral)) \
            or not _I32[0] <= int(layer) <= _I32[1] or not all(_plain_number(x) for x in (lo, hi, strength)):
        return None
    got = _clamp_dir(where, c["dir"])
    if got is None:
        return None
    ptr, n, owner = got
    if n != hidden:
        raise HiddenSizeError(f"shmsteer: clamp direction length is not the hidden size: {where} has {n} floats, "
                              f"hidden size is {hidden}")
    keep.append(owner)
    return hook_id(c.get("hook", "")), int(layer), float(lo), float(hi), float(strength), ptr, n


def split_clamps(override: Any, hook_id: Callable[[Union[str, int]], int], hidden: int
                 ) -> Tuple[Any, Optional[ctypes.Array], List[Any]]:
    """Take the clamps out of ``override`` (a dict in the engine's steering JSON shape), a whole
    tier at a time: (the override left for the JSON, the shmsteer_admit_clamp array of the taken
    ones or None, the objects owning their directions). A tier whose clamps are not all in the
    plain form stays in the JSON; so does everything without numpy. ``override`` itself is not
    changed."""
    if _np is None or not isinstance(override, dict):
        return override, None, []
    rest = dict(override)
    keep: List[Any] = []
    fields: List[Tuple[int, Tuple[int, int, float, float, float, int, int]]] = []
    for name, tier in TIERS.items():
        t = override.get(name)
        if not isinstance(t, dict) or not isinstance(t.get("clamps"), list) or not t["clamps"]:
            continue
        taken, held = [], len(keep)
        for i, c in enumerate(t["clamps"]):
            f = _clamp_fields(f"override {name} clamp {i}", c, hook_id, hidden, keep)
            if f is None:
                break
            taken.append((tier, f))
        if len(taken) != len(t["clamps"]):
            del keep[held:]
            continue
        fields += taken
        rest[name] = {k: v for k, v in t.items() if k != "clamps"}
    if not fields:
        return override, None, []
    arr = (_lib.AdmitClampC * len(fields))()
    for e, (tier, (hook, layer, lo, hi, strength, ptr, n)) in zip(arr, fields):
        e.tier, e.hook, e.layer, e.min, e.max, e.strength = tier, hook, layer, lo, hi, strength
        e.dir, e.len = ctypes.cast(ptr, POINTER(c_float)), n
    return rest, arr, keep
