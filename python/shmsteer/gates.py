"""Declarative gates (the vLLM fork's ``steering`` field) checked without an owner.

:func:`check_gates` runs the admission's own reading of a request's gates, in the library
(``shmsteer_gates_check``: steer.DecodeGates with the admission's unpacker), in any process:
a gate :meth:`shmsteer.Owner.admit` would refuse for its form (a malformed gate, attenuate with a
``this_token`` probe, a non-finite threshold) is refused here with the same exception and
message, before the request reaches the owner. What needs the owner and its model (a named
vector it does not have, a probe not at one site, an inline vector's width or layer) is checked
with a snapshot of the owner's region, ``check_gates(gates, at=snapshot)``
(``shmsteer_gates_check_at``: the admission's own resolution of the gates at that version,
from any process attached to the owner). The vLLM plugin's frontend calls both, so such a gate
is a 400 (docs/vllm.md, "Gates").
"""

from __future__ import annotations

import json
from ctypes import byref, c_size_t
from typing import TYPE_CHECKING, Any, Dict, Optional

from ._lib import check, lib

if TYPE_CHECKING:  # pragma: no cover
    from .snapshot import Snapshot

__all__ = ["check_gates", "gates_for_abi"]


def gates_for_abi(steering: Any) -> Any:
    """The gates with every inline source's packed blobs decoded into the C ABI's vector form
    ``{hook: [{"layer", "scale", "data"}]}``; anything else is passed on for the engine to judge.
    A packed blob that does not decode raises :class:`~shmsteer.openai.SteeringRequestError`."""
    from .openai import _vectors

    def source(src: Any) -> Any:
        if isinstance(src, dict) and src.get("kind") == "inline" and isinstance(src.get("packed"), dict) and src["packed"]:
            packed = src["packed"]
            out: Dict[str, Any] = {}
            for v in _vectors("steering", packed, tuple(packed)):
                data = v["data"]  # float32 arrays from the packed blob; the gates' form is JSON lists
                out.setdefault(v["hook"], []).append({"layer": v["layer"], "scale": v["scale"],
                                                      "data": data.tolist() if hasattr(data, "tolist") else data})
            return {"kind": "inline", "packed": out}
        return src

    if not isinstance(steering, (list, tuple)):
        return steering
    gates = []
    for g in steering:
        if isinstance(g, dict):
            g = dict(g)
            for part, key in (("when", "probe"), ("apply", "steer")):
                if isinstance(g.get(part), dict) and key in g[part]:
                    g[part] = dict(g[part], **{key: source(g[part][key])})
        gates.append(g)
    return gates


def check_gates(steering: Any, at: Optional["Snapshot"] = None, request_id: str = "") -> int:
    """Check a request's gates as an admission would, without an owner; returns their number.

    Args:
        steering: the gates as :meth:`shmsteer.Owner.admit` takes them (a list of
            ``{"when", "scope", "apply"}`` dicts; None: no gates), sent exactly as it sends
            them; or the JSON text of the fork's ``steering`` value (str or bytes), read as is
            (packed inline blobs are unpacked by the library).
        at: a snapshot of an owner or a client (``owner.snapshot()``, ``client.snapshot()``):
            also check what an admission at that version checks against the owner's vectors
            and model (``shmsteer_gates_check_at``), so every refusal below is the admission's,
            message included; None: the gates' form only.
        request_id: with ``at``, the messages name the request as an admission of that id does
            (``request "id": steering[0]...``); empty: no request named.

    Raises:
        BadGateError: a malformed gate (the message names the gate and the field), a value
            that is not a list, more than 64 gates, a packed blob the library cannot unpack.
        GateUnsupportedError: attenuate with a ``this_token`` probe.
        NonFiniteError: a threshold, sharpness or strength beyond float32 (or NaN).
        BadNameError: a vector name longer than 256 bytes.
        InvalidArgumentError: text that is not one JSON value.
        SteeringRequestError: a packed blob of a list that does not decode in Python (as in
            ``Owner.admit``).

        With ``at`` also: UnknownVectorError (a gate names a vector the owner does not have: a
        probe vector for a probe, a steering vector for an add), ProbeSiteError (an inline probe
        not at exactly one site), UnknownHookError, LayerRangeError, HiddenSizeError,
        DuplicateError, NonFiniteError (an inline vector that does not fit the model),
        OverflowSteeringError (an add's strength times its vectors beyond the bound).
    """
    if isinstance(steering, str):
        js = steering.encode()
    elif isinstance(steering, (bytes, bytearray)):
        js = bytes(steering)
    else:
        js = json.dumps(gates_for_abi(steering)).encode()
    n = c_size_t(0)
    if at is None:
        check(lib.shmsteer_gates_check(js, len(js), byref(n)))
    else:
        rid = request_id.encode()
        check(lib.shmsteer_gates_check_at(at._handle(), rid, len(rid), js, len(js), byref(n)))
    return n.value
