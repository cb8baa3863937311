"""Per-request steering of OpenAI request bodies, as the vLLM fork accepts it.

The RhizoNymph vLLM fork takes steering fields in ``/v1/chat/completions`` and
``/v1/completions`` bodies: ``steering_vectors``, ``prefill_steering_vectors`` and
``decode_steering_vectors`` (packed only: ``{hook: {dtype, shape, layer_indices, data, scales?}}``),
``steering_clamps`` and its phase tiers (``{hook: {layer: [clamp entry]}}`` or the packed
``{hook: {dtype, shape, layer_indices, data, bounds, strengths}}``), ``steering_name`` and
``conversation_id``. shmsteer is not a model server: :func:`admission_from_request` gives a model
server the translation into the keyword arguments of :meth:`shmsteer.Owner.admit`, validating as
the fork's frontend does, in its order and with its 400 texts
(:class:`SteeringRequestError`, a ``ValueError``, carries the text and the HTTP status).

    kwargs = admission_from_request(body, model=owner.model)
    owner.admit(request_id, **kwargs)

Differences, on purpose: ``steering_name`` names a module in the fork; the Python owner has no
modules, so it becomes a reference (strength 1) to the named vector of that name in the base tier
(serve's Go ``AdmissionFromRequest`` maps it to a serve module instead). ``steering`` (the fork's
declarative gates) is passed on as ``steering=``: ``Owner.admit`` checks it (typed errors).

A vector tier's rows come out as numpy float32 arrays (1-D read-only views of one array per
blob), which ``Owner.admit`` passes to the engine by address (:mod:`shmsteer.admission`): no
float list is built or printed. Without numpy they are float lists, as clamp directions always
are (base64 and struct decode those).
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

try:  # numpy is optional: without it the vectors' rows are float lists
    import numpy as _np
except ImportError:  # pragma: no cover - exercised only where numpy is missing
    _np = None

__all__ = ["SteeringRequestError", "admission_from_request", "DEFAULT_HOOKS", "DEFAULT_MAX_CLAMP_DIRECTIONS"]

DEFAULT_HOOKS: Tuple[str, ...] = ("pre_attn", "post_attn", "post_block", "mlp_in", "mlp_out")
"""The fork's hook points (and shmsteer's default hooks)."""

DEFAULT_MAX_CLAMP_DIRECTIONS = 4
"""The fork's default per-(hook, layer) clamp budget (steering_config.max_clamp_directions)."""

# The largest float32 not above steer.MaxMagnitude (1e30): an open clamp bound, as serve uses.
_OPEN = struct.unpack("<f", struct.pack("<I", struct.unpack("<I", struct.pack("<f", 1e30))[0] - 1))[0]

_DTYPES = {"float16": (2, "e"), "float32": (4, "f"), "float64": (8, "d"), "bfloat16": (2, None)}


class SteeringRequestError(ValueError):
    """A request body's steering fields are refused; ``str(err)`` is the fork's 400 text and
    ``status`` the HTTP status to answer (400)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _kind(v: Any) -> str:
    """Python's type name of a decoded JSON value, as the fork's messages give it."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "float"
    return type(v).__name__


def _tuple(shape: Sequence[Any]) -> str:
    return "(" + ", ".join(str(x) for x in shape) + ("," if len(shape) == 1 else "") + ")"


def _decode_rows(blob: Mapping[str, Any], what: str, path: str, arrays: bool = False) -> Any:
    """Decode a packed blob's base64 little-endian rows of shape [n, width]: to lists of floats
    at the blob's precision, or with ``arrays`` (and numpy) to one read-only ``(n, width)``
    float32 array, converted once (round to nearest, ties to even)."""
    dtype = blob.get("dtype")
    if dtype not in _DTYPES:
        raise SteeringRequestError(f"{path}: {what}.dtype {dtype!r}: want float16, bfloat16, float32 or float64")
    shape = blob.get("shape")
    if not isinstance(shape, list) or len(shape) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in shape):
        raise SteeringRequestError(f"{what}.shape must be 2-D [num_layers, hidden_size]; got {shape!r}")
    n, width = shape
    if n < 1 or width < 1:
        raise SteeringRequestError(f"{what}.shape entries must be >= 1; got {_tuple(shape)}")
    size, code = _DTYPES[dtype]
    data = blob.get("data")
    if not isinstance(data, str):
        raise SteeringRequestError(f"{path}: {what}.data: want a base64 string, got {_kind(data)}")
    raw = _b64decode(data, what, path)
    want = n * width * size
    if len(raw) != want:
        raise SteeringRequestError(f"{what}.data length {len(raw)} != expected {want} "
                                   f"(shape={_tuple(shape)}, dtype={dtype})")
    if arrays and _np is not None:
        return _rows_array(raw, dtype, n, width)
    if code is None:  # bfloat16: the high half of a float32
        halves = struct.unpack(f"<{n * width}H", raw)
        flat = list(struct.unpack(f"<{n * width}f", struct.pack(f"<{n * width}I", *(h << 16 for h in halves))))
    else:
        flat = list(struct.unpack(f"<{n * width}{code}", raw))
    return [flat[r * width:(r + 1) * width] for r in range(n)]


def _b64decode(data: str, what: str, path: str) -> bytes:
    """``base64.b64decode(data, validate=True)`` without its regular-expression pass over the
    string: binascii's strict mode takes only what that takes, with the same bytes; anything
    it refuses is decoded (or refused, with the same text as before) the old way."""
    try:
        return binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError):
        pass
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise SteeringRequestError(f"{path}: {what}.data is not base64: {e}") from None


def _rows_array(raw: bytes, dtype: str, n: int, width: int) -> Any:
    """The (n, width) float32 array of raw little-endian rows of dtype (numpy present): float32
    rows are a read-only view of ``raw``; the others are converted into a new array."""
    if dtype == "float32":
        a = _np.frombuffer(raw, dtype="<f4")
    elif dtype == "bfloat16":  # the high half of a float32
        a = (_np.frombuffer(raw, dtype="<u2").astype(_np.uint32) << 16).view(_np.float32)
    else:
        with _np.errstate(over="ignore"):  # beyond float32: inf, refused by the engine as non-finite
            a = _np.frombuffer(raw, dtype="<f2" if dtype == "float16" else "<f8").astype(_np.float32)
    a = a.reshape(n, width)
    a.flags.writeable = False
    return a


def _layer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _vectors(field: str, spec: Any, hooks: Sequence[str]) -> List[Dict[str, Any]]:
    """A per-request vector tier: packed blobs only (the fork's pydantic type), unpacked."""
    if spec is None:
        return []
    if not isinstance(spec, dict):
        raise SteeringRequestError(f"{field}: Input should be a valid dictionary, got {_kind(spec)}")
    for hook in sorted(spec):
        blob = spec[hook]
        if not isinstance(blob, dict):
            raise SteeringRequestError(f"{field}.{hook}: Input should be a valid dictionary (a SteeringHookPacked "
                                       f"blob), got {_kind(blob)}")
        for k in ("dtype", "shape", "layer_indices", "data"):
            if k not in blob:
                raise SteeringRequestError(f"{field}.{hook}.{k}: Field required (per-request vectors are "
                                           "SteeringHookPacked blobs {dtype, shape, layer_indices, data, scales?}; "
                                           "pack the vectors)")
    out: List[Dict[str, Any]] = []
    for hook in sorted(spec):
        if hook not in hooks:
            raise SteeringRequestError(f"{field} key {hook!r} is not a valid hook point. Valid values: {sorted(hooks)}")
        blob = spec[hook]
        rows = _decode_rows(blob, "SteeringHookPacked", f"{field}[{hook!r}]", arrays=True)
        idx, scales = blob["layer_indices"], blob.get("scales")
        if not isinstance(idx, list) or len(idx) != len(rows):
            got = len(idx) if isinstance(idx, list) else _kind(idx)
            raise SteeringRequestError(f"SteeringHookPacked.layer_indices length ({got}) must equal shape[0] ({len(rows)})")
        if scales is not None and (not isinstance(scales, list) or len(scales) != len(rows)):
            got = len(scales) if isinstance(scales, list) else _kind(scales)
            raise SteeringRequestError(f"SteeringHookPacked.scales length ({got}) must equal layer_indices length ({len(idx)})")
        seen = set()
        for r, layer in enumerate(idx):
            if not _layer(layer):
                raise SteeringRequestError(f"{field}[{hook!r}] keys must be non-negative integers, got {layer!r}.")
            if layer in seen:
                raise SteeringRequestError(f"{field}[{hook!r}]: layer {layer} given twice")
            seen.add(layer)
            scale = 1.0 if scales is None else scales[r]
            if isinstance(scale, bool) or not isinstance(scale, (int, float)):
                raise SteeringRequestError(f"{field}[{hook!r}][{layer}]['scale'] must be a finite float, got {_kind(scale)}.")
            if not math.isfinite(scale):
                raise SteeringRequestError(f"{field}[{hook!r}][{layer}]['scale'] must be finite, got {scale}.")
            out.append({"hook": hook, "layer": layer, "scale": float(scale), "data": rows[r]})
    return out


def _clamp_entry(entry: Any, path: str) -> Tuple[List[float], float, float, float]:
    """(direction, lo, hi, strength) of a clamp entry, with the fork's checks and texts."""
    if not isinstance(entry, dict):
        raise SteeringRequestError(f"{path}: Clamp entry must be a dict, got {_kind(entry)}")
    allowed = {"vector", "value", "min", "max", "strength"}
    extra = set(entry) - allowed
    if extra:
        raise SteeringRequestError(f"{path}: Clamp entry has unexpected keys: {sorted(extra)}; "
                                   f"allowed keys: {sorted(allowed)}")
    if "vector" not in entry:
        raise SteeringRequestError(f"{path}: Clamp entry missing required key 'vector'")

    def num(k: str) -> Optional[float]:
        v = entry.get(k)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SteeringRequestError(f"{path}: Clamp entry {k!r} must be a number, got {_kind(v)}")
        if not math.isfinite(v):
            raise SteeringRequestError(f"{path}: Clamp entry {k!r} must be finite, got {v}")
        return float(v)

    value, lo, hi, strength = num("value"), num("min"), num("max"), num("strength")
    if value is not None and (lo is not None or hi is not None):
        raise SteeringRequestError(f"{path}: Clamp entry 'value' is mutually exclusive with 'min'/'max'")
    if value is not None:
        lo = hi = value
    elif lo is None and hi is None:
        raise SteeringRequestError(f"{path}: Clamp entry must set at least one of 'value', 'min', 'max'")
    lo = -_OPEN if lo is None else lo
    hi = _OPEN if hi is None else hi
    if lo > hi:
        raise SteeringRequestError(f"{path}: Clamp entry min ({lo}) must be <= max ({hi})")
    strength = 1.0 if strength is None else strength
    if not 0.0 <= strength <= 1.0:
        raise SteeringRequestError(f"{path}: Clamp entry strength must be in [0, 1], got {strength}")
    vec = entry["vector"]
    if not isinstance(vec, list) or not vec:
        shape = "(0,)" if isinstance(vec, list) else _kind(vec)
        raise SteeringRequestError(f"{path}: Clamp entry vector must be a non-empty 1-D float list, got shape {shape}")
    floats = _finite_floats(vec)
    if floats is None:  # numpy absent, or an element it refuses: find it, as the fork does
        for i, x in enumerate(vec):
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise SteeringRequestError(f"{path}['vector'][{i}] must be a finite float, got {_kind(x)}")
            if not math.isfinite(x):
                raise SteeringRequestError(f"{path}: Clamp entry vector must contain only finite floats")
        floats = [float(x) for x in vec]
    if not any(x != 0 for x in floats):
        raise SteeringRequestError(f"{path}: Clamp entry vector must be non-zero (a zero vector cannot be "
                                   "normalized to a direction)")
    return floats, lo, hi, strength


_PLAIN_NUMBERS = frozenset((int, float))


def _finite_floats(vec: List[Any]) -> Optional[List[float]]:
    """``[float(x) for x in vec]`` when every element is an int or a float (never a bool) and
    finite, checked and converted by numpy in one pass (a clamp direction is a JSON list of
    hidden-size numbers: element by element in Python, 1.4 ms for 1024 of them); None without
    numpy or when an element fails, for the caller's element-by-element checks to name it."""
    if _np is None or not set(map(type, vec)) <= _PLAIN_NUMBERS:
        return None
    try:
        a = _np.array(vec, dtype=_np.float64)
    except (OverflowError, ValueError, TypeError):
        return None
    if not _np.isfinite(a).all():
        return None
    out: List[float] = a.tolist()
    return out


def _clamps(field: str, spec: Any, hooks: Sequence[str]) -> List[Dict[str, Any]]:
    """A per-request clamp tier: entry lists or packed ClampHookPacked blobs."""
    if spec is None or spec == {}:
        return []
    if not isinstance(spec, dict):
        raise SteeringRequestError(f"{field}: Input should be a valid dictionary, got {_kind(spec)}")
    out: List[Dict[str, Any]] = []
    for hook in sorted(spec):
        table = spec[hook]
        path = f"{field}[{hook!r}]"
        if not isinstance(table, dict):
            raise SteeringRequestError(f"{path} must map layer indices to entry lists, got {_kind(table)}")
        if "data" in table and "dtype" in table and "bounds" in table:
            out.extend(_packed_clamps(field, hook, table))
        else:
            layers = {}
            for key, entries in table.items():
                if not (isinstance(key, str) and key.isdigit()):
                    raise SteeringRequestError(f"{path} has invalid layer index {key!r}; expected a non-negative integer")
                if not isinstance(entries, list):
                    raise SteeringRequestError(f"{path}[{int(key)}] must be a list of clamp entries, got {_kind(entries)}")
                layers[int(key)] = entries
            width = None
            for layer in sorted(layers):
                for e in layers[layer]:
                    vec, lo, hi, strength = _clamp_entry(e, f"{path}[{layer}]")
                    if width is not None and len(vec) != width:
                        raise SteeringRequestError(f"{path}[{layer}]: direction width {len(vec)} != {width} of earlier "
                                                   "entries in the same hook")
                    width = len(vec)
                    out.append({"hook": hook, "layer": layer, "dir": vec, "min": lo, "max": hi, "strength": strength})
        if hook not in hooks:
            raise SteeringRequestError(f"{field} key {hook!r} is not a valid hook point. Valid values: {sorted(hooks)}")
    return out


def _packed_clamps(field: str, hook: str, blob: Mapping[str, Any]) -> List[Dict[str, Any]]:
    path = f"{field}: ClampHookPacked[{hook!r}]"
    allowed = {"dtype", "shape", "layer_indices", "data", "bounds", "strengths"}
    extra = set(blob) - allowed
    if extra:
        raise SteeringRequestError(f"{path}: unknown field {sorted(extra)[0]!r}")
    rows = _decode_rows(blob, "ClampHookPacked", f"{field}[{hook!r}]")
    n = len(rows)
    for name in ("layer_indices", "bounds", "strengths"):
        v = blob.get(name)
        if not isinstance(v, list) or len(v) != n:
            got = len(v) if isinstance(v, list) else _kind(v)
            raise SteeringRequestError(f"{path}.{name} length ({got}) must equal shape[0] ({n})")
    out = []
    for i, r in enumerate(rows):
        layer, pair, strength = blob["layer_indices"][i], blob["bounds"][i], blob["strengths"][i]
        if not _layer(layer):
            raise SteeringRequestError(f"{path}.layer_indices entries must be non-negative ints; got {layer!r}")
        if not isinstance(pair, list) or len(pair) != 2:
            raise SteeringRequestError(f"{path}.bounds[{i}] must be a [lo, hi] pair")
        lo = -_OPEN if pair[0] is None else float(pair[0])
        hi = _OPEN if pair[1] is None else float(pair[1])
        if lo > hi:
            raise SteeringRequestError(f"{path}: Clamp entry min ({lo}) must be <= max ({hi})")
        if not 0.0 <= float(strength) <= 1.0:
            raise SteeringRequestError(f"{path}: Clamp entry strength must be in [0, 1], got {strength}")
        if not all(math.isfinite(x) for x in r):
            raise SteeringRequestError(f"{field}[{hook!r}]: clamp direction rows must contain only finite floats")
        if not any(x != 0 for x in r):
            raise SteeringRequestError(f"{field}[{hook!r}]: Clamp entry vector must be non-zero (a zero vector cannot "
                                       "be normalized to a direction)")
        out.append({"hook": hook, "layer": layer, "dir": r, "min": lo, "max": hi, "strength": float(strength)})
    return out


_TIERS = (("base", "steering_vectors", "steering_clamps"),
          ("prefill", "prefill_steering_vectors", "prefill_steering_clamps"),
          ("decode", "decode_steering_vectors", "decode_steering_clamps"))


def admission_from_request(body: Mapping[str, Any], model: Optional[Tuple[int, int, Sequence[str]]] = None,
                           max_clamp_directions: int = DEFAULT_MAX_CLAMP_DIRECTIONS) -> Dict[str, Any]:
    """Translate the steering fields of an OpenAI request body into ``Owner.admit`` kwargs.

    ``body`` is the decoded JSON body of a ``/v1/chat/completions`` or ``/v1/completions``
    request (its other fields are ignored). ``model`` is ``(hidden, layers, hooks)`` as
    ``Owner.model`` gives it: widths are checked against ``hidden`` and hook names against
    ``hooks`` (without it, the fork's hook names and no width check). ``max_clamp_directions``
    is the per-(hook, layer) clamp budget after the base and phase tiers are concatenated (0
    disables clamps). Returns ``{"override": steering, "conversation": id, "steering": gates}``
    with only the keys the body gives (``{}`` for a body without steering). A vector's
    ``data`` is a 1-D read-only numpy float32 array (a float list without numpy): float32,
    float16 and bfloat16 rows bit for bit, float64 rows rounded to float32 once (to nearest,
    ties to even, as serve's Go decoder does). Raises :class:`SteeringRequestError`
    with the fork's text, in the fork's order: field types, unpacking and hook names, clamp
    entries, overlapping widths across tiers, widths against the model, the clamp budget.
    """
    if not isinstance(body, Mapping):
        raise SteeringRequestError(f"request body: want a JSON object, got {_kind(body)}")
    hidden, hooks = None, DEFAULT_HOOKS
    if model is not None:
        hidden, _, model_hooks = model
        hooks = tuple(model_hooks)
    out: Dict[str, Any] = {}
    for field in ("steering_name", "conversation_id"):
        v = body.get(field)
        if v is not None and not isinstance(v, str):
            raise SteeringRequestError(f"{field}: Input should be a valid string, got {_kind(v)}")
    if body.get("steering") is not None:
        out["steering"] = body["steering"]
    tiers: Dict[str, Dict[str, List[Dict[str, Any]]]] = {}
    for tier, vfield, _ in _TIERS:
        tiers[tier] = {"vectors": _vectors(vfield, body.get(vfield), hooks)}
    for tier, _, cfield in _TIERS:
        tiers[tier]["clamps"] = _clamps(cfield, body.get(cfield), hooks)
    # Overlapping (hook, layer) entries of the tiers have one width (the fork's SamplingParams).
    width = {t: {(v["hook"], v["layer"]): len(v["data"]) for v in tiers[t]["vectors"]} for t in tiers}
    for a, b in (("base", "prefill"), ("base", "decode"), ("prefill", "decode")):
        an, bn = dict((t, f) for t, f, _ in _TIERS)[a], dict((t, f) for t, f, _ in _TIERS)[b]
        for site, w in width[a].items():
            if site in width[b] and width[b][site] != w:
                h, layer = site
                raise SteeringRequestError(f"{an}[{h!r}][{layer}] has dimension {w} but {bn}[{h!r}][{layer}] has "
                                           f"dimension {width[b][site]}. Overlapping entries must have matching "
                                           "dimensions.")
    if hidden is not None:
        for tier, vfield, _ in _TIERS:
            for v in tiers[tier]["vectors"]:
                if len(v["data"]) != hidden:
                    raise SteeringRequestError(f"{vfield}[{v['hook']!r}][{v['layer']}]: vector width {len(v['data'])} "
                                               f"!= expected steering row width {hidden} (model hidden size)")
    if any(tiers[t]["clamps"] for t in tiers):
        if max_clamp_directions <= 0:
            raise SteeringRequestError("Per-request clamps were provided but clamping is disabled "
                                       "(steering_config.max_clamp_directions=0).")
        if hidden is not None:
            for tier, _, cfield in _TIERS:
                for c in tiers[tier]["clamps"]:
                    if len(c["dir"]) != hidden:
                        raise SteeringRequestError(f"{cfield}[{c['hook']!r}]: clamp direction width {len(c['dir'])} "
                                                   f"does not match the model hidden size ({hidden})")
        for phase in ("prefill", "decode"):
            count: Dict[Tuple[str, int], int] = {}
            for c in tiers["base"]["clamps"] + tiers[phase]["clamps"]:
                count[(c["hook"], c["layer"])] = count.get((c["hook"], c["layer"]), 0) + 1
            over = sorted(s for s, n in count.items() if n > max_clamp_directions)
            if over:
                h, layer = over[0]
                raise SteeringRequestError(f"Clamp spec [{h!r}][{layer}] has {count[over[0]]} directions, exceeding "
                                           f"max_clamp_directions={max_clamp_directions}")
    override: Dict[str, Any] = {}
    for tier, t in tiers.items():
        part = {k: v for k, v in t.items() if v}
        if part:
            override[tier] = part
    name = body.get("steering_name")
    if name:
        override.setdefault("base", {}).setdefault("refs", []).append({"name": name, "strength": 1.0})
    if override:
        out["override"] = override
    if body.get("conversation_id"):
        out["conversation"] = body["conversation_id"]
    return out
