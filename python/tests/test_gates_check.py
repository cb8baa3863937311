"""shmsteer.check_gates (shmsteer_gates_check): the owner's reading of a request's gates without
an owner. Every gate kind docs/gates.md lists is accepted; what an admission refuses for its form
is refused with the admission's exception and message (checked against Owner.admit itself)."""

from __future__ import annotations

import base64
import json
from typing import Any, Dict, List

import numpy as np
import pytest

import shmsteer
from shmsteer import errors
from shmsteer.openai import SteeringRequestError

D = 8
SCOPES = ("this_token", "next_step", "rest_of_request", "rest_of_conversation")
NAMED_PROBE = {"kind": "probe", "probe": {"kind": "name", "name": "p"}, "threshold": 0.5, "sharpness": 4}
ALWAYS = {"kind": "always"}
ADD = {"kind": "add", "steer": {"kind": "name", "name": "s"}, "strength": 2}
ATTENUATE = {"kind": "attenuate", "strength": 0.25}


def _packed(layer: int, v: Any, dtype: str = "float32") -> Dict[str, Any]:
    v = np.asarray(v, dtype).reshape(1, -1)
    return {"dtype": dtype, "shape": list(v.shape), "layer_indices": [layer],
            "data": base64.b64encode(v.tobytes()).decode()}


def _unit(i: int) -> np.ndarray:
    v = np.zeros(D, np.float32)
    v[i] = 1
    return v


def _gate(when: Any, scope: str, apply: Any) -> Dict[str, Any]:
    return {"when": when, "scope": scope, "apply": apply}


def _inline(hook: str, layer: int, i: int) -> Dict[str, Any]:
    return {"kind": "inline", "packed": {hook: _packed(layer, _unit(i))}}


def every_kind() -> List[Dict[str, Any]]:
    """Every scope with add (probe and always) and attenuate (always; probe except this_token),
    named and packed inline sources."""
    gates = []
    for scope in SCOPES:
        gates += [_gate(NAMED_PROBE, scope, ADD), _gate(ALWAYS, scope, ADD), _gate(ALWAYS, scope, ATTENUATE)]
        if scope != "this_token":
            gates.append(_gate(NAMED_PROBE, scope, ATTENUATE))
    inline_probe = {"kind": "probe", "probe": _inline("post_block", 1, 0), "threshold": -0.5}
    gates.append(_gate(inline_probe, "this_token", {"kind": "add", "steer": _inline("mlp_out", 2, 1)}))
    return gates


def test_every_gate_kind_is_accepted() -> None:
    gates = every_kind()
    assert shmsteer.check_gates(gates) == len(gates) == 16
    assert shmsteer.check_gates(json.dumps(gates)) == 16  # the fork's JSON text, packed blobs unpacked in Go
    assert shmsteer.check_gates(json.dumps(gates).encode()) == 16
    for none in (None, [], "", "null", "[]"):
        assert shmsteer.check_gates(none) == 0, none


ATT_PROBE = [_gate(ALWAYS, "next_step", ADD), _gate(NAMED_PROBE, "this_token", ATTENUATE)]
REFUSED = {
    "attenuate with a this_token probe": (ATT_PROBE, errors.GateUnsupportedError,
                                          "steering[1]: shmsteer: unsupported steering gate: attenuate with "
                                          "when=probe and scope=this_token is not supported"),
    "inline attenuate probe": ([_gate({**NAMED_PROBE, "probe": _inline("post_block", 1, 0)}, "this_token", ATTENUATE)],
                               errors.GateUnsupportedError, "steering[0]: shmsteer: unsupported steering gate"),
    "bad scope": ([_gate(ALWAYS, "forever", ADD)], errors.BadGateError,
                  'steering[0]: shmsteer: bad steering gate: scope: "forever" is not one of this_token, next_step, '
                  "rest_of_request, rest_of_conversation"),
    "scope not a string": ([_gate(ALWAYS, 3, ADD)], errors.BadGateError, "scope: expected a string"),
    "not a list": ({"when": ALWAYS}, errors.BadGateError, "'steering' must be a list of gate objects"),
    "a gate not an object": (["always"], errors.BadGateError, "each steering gate must be an object"),
    "unknown apply": ([_gate(ALWAYS, "next_step", {"kind": "scale"})], errors.BadGateError,
                      'apply.kind: "scale" is not add or attenuate'),
    "probe without threshold": ([_gate({"kind": "probe", "probe": {"kind": "name", "name": "p"}}, "next_step", ADD)],
                                errors.BadGateError, "when.threshold: missing required field"),
    "negative sharpness": ([_gate({**NAMED_PROBE, "sharpness": -1}, "next_step", ADD)], errors.BadGateError,
                           "probe sharpness must be non-negative"),
    "threshold beyond float32": ([_gate({**NAMED_PROBE, "threshold": 1e39}, "next_step", ADD)],
                                 errors.NonFiniteError, "when.threshold must be finite"),
    "NaN threshold": ([_gate({**NAMED_PROBE, "threshold": float("nan")}, "next_step", ADD)],
                      errors.InvalidArgumentError, "shmsteer: invalid argument: JSON: invalid character 'N'"),
    "too many gates": ([_gate(ALWAYS, "next_step", ADD)] * 65, errors.BadGateError, "65 gates, at most 64"),
    "name too long": ([_gate(ALWAYS, "next_step", {"kind": "add", "steer": {"kind": "name", "name": "n" * 257}})],
                      errors.BadNameError, "apply.steer: shmsteer: vector name empty or longer than 256 bytes"),
    "packed blob that does not decode": ([_gate(ALWAYS, "next_step", {"kind": "add", "steer": {
        "kind": "inline", "packed": {"post_block": _packed(0, _unit(1), "float16") | {"data": "AAAA"}}}})],
        SteeringRequestError, "SteeringHookPacked.data length 3 != expected 16"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refusals_are_typed(case: str) -> None:
    gates, exc, text = REFUSED[case]
    with pytest.raises(exc) as e:
        shmsteer.check_gates(gates)
    assert text in str(e.value)
    assert isinstance(e.value, ValueError)  # the vLLM frontend turns it into a 400


@pytest.mark.parametrize("text,exc,msg", [
    ('[{"when": ', errors.InvalidArgumentError, "shmsteer: invalid argument: JSON: unexpected EOF"),
    ("[] []", errors.InvalidArgumentError, "trailing data"),
    ('{"when": {}}', errors.BadGateError, "'steering' must be a list of gate objects"),
    (json.dumps([_gate(ALWAYS, "next_step", {"kind": "add", "steer": {"kind": "inline", "packed": {
        "post_block": _packed(0, _unit(1)) | {"dtype": "int8"}}}})]), errors.BadGateError,
     'apply.steer.packed["post_block"]: shmsteer: bad steering gate: inline vectors of hook "post_block"'),
])
def test_refused_json_text(text: str, exc: type, msg: str) -> None:
    with pytest.raises(exc) as e:
        shmsteer.check_gates(text)
    assert msg in str(e.value)


def test_the_check_agrees_with_the_owner(ns: str, secret: bytes) -> None:
    """Every refusal above is the owner's own, exception and message; every kind accepted here is
    admitted by an owner that has the named vectors."""
    with shmsteer.Owner(ns, secret=secret, hidden=D, layers=3) as owner:
        owner.register_vector("p", [("post_block", 1, 1.0, _unit(0))], kind="probe")
        owner.register_vector("s", [("post_block", 2, 1.0, _unit(1))])
        for case, (gates, exc, _text) in sorted(REFUSED.items()):
            with pytest.raises(exc) as checked:
                shmsteer.check_gates(gates)
            with pytest.raises(exc) as admitted:
                owner.admit("r-" + case, steering=gates)
            assert str(checked.value) == str(admitted.value), case
        assert owner.admit("all", steering=every_kind()).version > 0
        owner.end("all")


def _packed_rows(layers: List[int], width: int = D) -> Dict[str, Any]:
    rows = np.zeros((len(layers), width), np.float32)
    rows[:, 0] = 1
    return {"dtype": "float32", "shape": list(rows.shape), "layer_indices": layers,
            "data": base64.b64encode(rows.tobytes()).decode()}


def _inline_at(hook: str, layers: List[int], width: int = D) -> Dict[str, Any]:
    return {"kind": "inline", "packed": {hook: _packed_rows(layers, width)}}


# What only the owner can judge: its vectors and its model (hidden D, 3 layers).
AT_OWNER = {
    "unknown probe name": ([_gate({**NAMED_PROBE, "probe": {"kind": "name", "name": "nope"}}, "next_step", ADD)],
                           errors.UnknownVectorError, 'steering[0].when.probe: unknown probe vector name "nope"'),
    "a steering vector is not a probe": ([_gate({**NAMED_PROBE, "probe": {"kind": "name", "name": "s"}}, "next_step",
                                                ADD)], errors.UnknownVectorError, 'unknown probe vector name "s"'),
    "unknown steering name": ([_gate(ALWAYS, "next_step", {**ADD, "steer": {"kind": "name", "name": "gone"}})],
                              errors.UnknownVectorError, 'steering[0].apply.steer: unknown steering vector name "gone"'),
    "inline probe at two sites": ([_gate(ALWAYS, "next_step", ADD),
                                   _gate({**NAMED_PROBE, "probe": _inline_at("post_block", [0, 1])}, "next_step", ADD)],
                                  errors.ProbeSiteError, "steering[1].when.probe: an inline probe names 2 sites"),
    "inline add of the wrong width": ([_gate(ALWAYS, "next_step", {"kind": "add", "steer": _inline_at("post_block", [0], D + 1)})],
                                      errors.HiddenSizeError, ("steering[0].apply.steer: shmsteer: vector length is not the hidden size: base vector 0 "
                                       "has 9 floats, hidden size is 8")),
    "inline probe at an unknown hook": ([_gate({**NAMED_PROBE, "probe": _inline_at("attn", [0])}, "next_step", ADD)],
                                        errors.UnknownHookError, 'steering[0].when.probe: base vector 0: shmsteer: unknown hook: "attn"'),
    "inline add beyond the layers": ([_gate(ALWAYS, "next_step", {"kind": "add", "steer": _inline_at("mlp_out", [3])})],
                                     errors.LayerRangeError, "steering[0].apply.steer: base vector 0: shmsteer: layer out of range: layer 3, model has 3"),
}


def test_the_check_at_a_snapshot_is_the_admissions(ns: str, secret: bytes) -> None:
    """check_gates(at=snapshot) (shmsteer_gates_check_at) refuses what an admission refuses for
    the owner's vectors and model, with its exception and its message (the request named as the
    admission names it, or not at all), from the owner and from a client (a frontend's view);
    every refusal of the form is still refused; every kind an admission accepts passes."""
    with shmsteer.Owner(ns, secret=secret, hidden=D, layers=3) as owner, \
            shmsteer.Client(ns, secret=secret) as client:
        owner.register_vector("p", [("post_block", 1, 1.0, _unit(0))], kind="probe")
        owner.register_vector("s", [("post_block", 2, 1.0, _unit(1))])
        for case, (gates, exc, text) in sorted(AT_OWNER.items()):
            shmsteer.check_gates(gates)  # the form is fine: only the owner can refuse these
            rid = "r-" + case.replace(" ", "-")
            with pytest.raises(exc) as admitted:
                owner.admit(rid, steering=gates)
            assert text in str(admitted.value), (case, str(admitted.value))
            for reader in (owner, client):
                with reader.snapshot() as snap:
                    with pytest.raises(exc) as named:
                        shmsteer.check_gates(gates, at=snap, request_id=rid)
                    with pytest.raises(exc) as unnamed:
                        shmsteer.check_gates(gates, at=snap)
                assert str(named.value) == str(admitted.value), case
                assert str(unnamed.value) == str(admitted.value).replace(f'request "{rid}": ', ""), case
                assert isinstance(unnamed.value, (ValueError, LookupError))
        with client.snapshot() as snap:
            for case, (gates, exc, _text) in sorted(REFUSED.items()):
                with pytest.raises(exc) as checked:
                    shmsteer.check_gates(gates)
                with pytest.raises(exc) as at:
                    shmsteer.check_gates(gates, at=snap)
                assert str(at.value) == str(checked.value), case
            assert shmsteer.check_gates(every_kind(), at=snap) == 16
            assert shmsteer.check_gates(None, at=snap) == 0
        owner.register_vector("nope", [("post_block", 0, 1.0, _unit(2))], kind="probe")
        with client.snapshot() as snap:  # registered since: the same gates pass at a later version
            assert shmsteer.check_gates(AT_OWNER["unknown probe name"][0], at=snap) == 1


def test_the_abi_of_the_check_at_a_snapshot(ns: str, secret: bytes) -> None:
    """shmsteer_gates_check_at itself: a handle that is no live snapshot, an id or JSON pointer
    NULL with a length, are refused; a NULL count is not written; an empty id names no request."""
    from ctypes import byref, c_size_t

    from shmsteer._lib import check, lib
    js = json.dumps([_gate(ALWAYS, "next_step", ADD)]).encode()
    with pytest.raises(errors.BadHandleError):
        check(lib.shmsteer_gates_check_at(0, None, 0, js, len(js), None))
    with shmsteer.Owner(ns, secret=secret, hidden=D, layers=3) as owner:
        owner.register_vector("s", [("post_block", 2, 1.0, _unit(1))])
        with owner.snapshot() as snap:
            h = snap._handle()
            for rid, n_id, text, n_js in ((None, 3, js, len(js)), (b"r", 1, None, 5)):
                with pytest.raises(errors.InvalidArgumentError):
                    check(lib.shmsteer_gates_check_at(h, rid, n_id, text, n_js, None))
            check(lib.shmsteer_gates_check_at(h, None, 0, js, len(js), None))
            n = c_size_t(7)
            check(lib.shmsteer_gates_check_at(h, b"r", 1, None, 0, byref(n)))
            assert n.value == 0
        with owner.snapshot() as snap:
            snap_h = snap._handle()
        with pytest.raises(errors.BadHandleError):  # closed
            check(lib.shmsteer_gates_check_at(snap_h, None, 0, js, len(js), None))
