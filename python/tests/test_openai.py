"""shmsteer.openai.admission_from_request: the fork's OpenAI request-body tests
(tests/entrypoints/openai/test_steering_protocol.py and test_steering_clamps_frontend.py of
RhizoNymph/vllm), ported; their bodies go to Owner.admit and a stepper reads what a worker adds."""

from __future__ import annotations

import base64
import struct

import numpy as np
import pytest

import shmsteer
from shmsteer.openai import SteeringRequestError, admission_from_request

HIDDEN = 8
MODEL = (HIDDEN, 24, list(shmsteer.openai.DEFAULT_HOOKS))
CHAT = {"messages": [{"role": "user", "content": "Hello"}], "model": "test-model"}
COMPLETION = {"prompt": "Hello", "model": "test-model"}


def pack(layers, dtype="float32", scales=None):
    """The fork's _pack: one SteeringHookPacked blob, rows in layer order."""
    idx = sorted(layers)
    code = {"float32": "f", "float64": "d", "float16": "e"}[dtype]
    raw = b"".join(struct.pack(f"<{len(layers[i])}{code}", *layers[i]) for i in idx)
    blob = {"dtype": dtype, "shape": [len(idx), len(layers[idx[0]])], "layer_indices": idx,
            "data": base64.b64encode(raw).decode("ascii")}
    if scales is not None:
        blob["scales"] = scales
    return blob


BASE = {"pre_attn": pack({15: [0.1] * HIDDEN})}
PREFILL = {"pre_attn": pack({15: [0.7] * HIDDEN})}
DECODE = {"post_attn": pack({20: [1.0] * HIDDEN})}


def admit(body, **extra):
    return admission_from_request({**body, **extra}, model=MODEL)


def vec(ov, tier, hook, layer):
    for v in ov[tier]["vectors"]:
        if (v["hook"], v["layer"]) == (hook, layer):
            return [v["scale"] * x for x in v["data"]]
    return None


def entry(axis=0, value=2.0, hidden=HIDDEN):
    v = [0.0] * hidden
    v[axis] = 2.0  # non-unit on purpose
    return {"vector": v, "value": value}


@pytest.mark.parametrize("body", [CHAT, COMPLETION], ids=["chat", "completion"])
class TestRequestSteering:
    def test_no_steering_fields(self, body):
        assert admit(body) == {}

    def test_packed_tiers(self, body):
        kw = admit(body, steering_vectors=BASE, prefill_steering_vectors=PREFILL, decode_steering_vectors=DECODE)
        ov = kw["override"]
        assert vec(ov, "base", "pre_attn", 15) == pytest.approx([0.1] * HIDDEN)
        assert vec(ov, "prefill", "pre_attn", 15) == pytest.approx([0.7] * HIDDEN)
        assert vec(ov, "decode", "post_attn", 20) == [1.0] * HIDDEN

    def test_legacy_list_of_floats_rejected(self, body):
        with pytest.raises(SteeringRequestError, match="Field required") as e:
            admit(body, steering_vectors={"pre_attn": {"15": [0.1, 0.2, 0.3]}})
        assert e.value.status == 400

    def test_legacy_scaled_dict_rejected(self, body):
        with pytest.raises(SteeringRequestError):
            admit(body, steering_vectors={"post_block": {"10": {"vector": [0.4, 0.5, 0.6], "scale": 2.0}}})

    def test_none_when_absent(self, body):
        assert admit(body, steering_vectors=None, steering_clamps=None) == {}

    def test_per_row_scales_applied_at_unpack(self, body):
        ov = admit(body, steering_vectors={"post_block": pack({10: [1.0] * HIDDEN}, scales=[2.0])})["override"]
        assert vec(ov, "base", "post_block", 10) == [2.0] * HIDDEN

    def test_conversation_id(self, body):
        assert admit(body, conversation_id="conv-7") == {"conversation": "conv-7"}


def test_steering_name_becomes_a_reference():
    kw = admit(CHAT, steering_name="base_personality", steering_vectors=BASE)
    assert kw["override"]["base"]["refs"] == [{"name": "base_personality", "strength": 1.0}]
    assert vec(kw["override"], "base", "pre_attn", 15) is not None
    with pytest.raises(SteeringRequestError, match="valid string"):
        admit(CHAT, steering_name=3)


def test_gates_are_passed_on():
    gates = [{"when": {"kind": "always"}, "scope": "next_step", "apply": {"kind": "attenuate", "strength": 0.5}}]
    assert admit(CHAT, steering=gates)["steering"] == gates


@pytest.mark.parametrize("kw,match", [
    ({"steering_vectors": {"bogus": pack({0: [1.0] * HIDDEN})}}, "is not a valid hook point"),
    ({"steering_vectors": {"pre_attn": pack({1: [1.0, 2.0, 3.0]})}}, r"steering_vectors\['pre_attn'\]\[1\]: vector width 3"),
    ({"steering_vectors": {"pre_attn": {**pack({0: [1.0] * HIDDEN}), "data": base64.b64encode(b"\0" * 8).decode()}}},
     r"data length 8 != expected 32 \(shape=\(1, 8\), dtype=float32\)"),
    ({"steering_vectors": {"pre_attn": pack({0: [1.0] * HIDDEN})}, "decode_steering_vectors": {"pre_attn": pack({0: [1.0] * 4})}},
     "Overlapping entries must have matching dimensions"),
    ({"steering_clamps": {"post_block": {"abc": [entry()]}}}, "layer index"),
    ({"steering_clamps": {"post_block": [entry()]}}, "must map"),
    ({"steering_clamps": {"post_block": {"5": [{"vector": [0.0] * HIDDEN, "value": 1.0}]}}}, "zero"),
    ({"steering_clamps": {"post_block": {"5": [{"vector": [1.0] * HIDDEN}]}}}, "at least one"),
    ({"steering_clamps": {"bogus": {"5": [entry()]}}}, "hook point"),
    ({"steering_clamps": {"post_block": {"5": [entry(hidden=16)]}}}, "width"),
])
def test_refusals_carry_the_forks_text(kw, match):
    with pytest.raises(SteeringRequestError, match=match):
        admit(CHAT, **kw)


def test_clamps_coerced_and_budgeted():
    kw = admit(CHAT, steering_clamps={"post_block": {"5": [entry()]}},
               decode_steering_clamps={"post_block": {"6": [entry(1, 3.0)]}})
    c = kw["override"]["base"]["clamps"][0]
    assert (c["hook"], c["layer"], c["min"], c["max"]) == ("post_block", 5, 2.0, 2.0)
    assert kw["override"]["decode"]["clamps"][0]["layer"] == 6
    with pytest.raises(SteeringRequestError, match="max_clamp_directions=0"):
        admission_from_request({**CHAT, "steering_clamps": {"post_block": {"5": [entry()]}}}, model=MODEL,
                               max_clamp_directions=0)
    with pytest.raises(SteeringRequestError, match=r"Clamp spec \['post_block'\]\[5\] has 3 directions"):
        admission_from_request({**CHAT, "steering_clamps": {"post_block": {"5": [entry(), entry(1)]}},
                                "decode_steering_clamps": {"post_block": {"5": [entry(2)]}}},
                               model=MODEL, max_clamp_directions=2)
    packed = {"dtype": "float64", "shape": [1, HIDDEN], "layer_indices": [5],
              "data": pack({0: [1.0] + [0.0] * (HIDDEN - 1)}, "float64")["data"], "bounds": [[None, 2.0]], "strengths": [0.5]}
    c = admit(CHAT, steering_clamps={"post_block": packed})["override"]["base"]["clamps"][0]
    assert (c["layer"], c["max"], c["strength"]) == (5, 2.0, 0.5) and c["min"] < -1e29


def test_admitted_end_to_end(ns, secret):
    """The translation is what Owner.admit takes, and a worker's stepper adds it."""
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=24) as owner:
        kw = admission_from_request({**CHAT, "steering_vectors": BASE, "prefill_steering_vectors": PREFILL,
                                     "decode_steering_vectors": DECODE, "conversation_id": "c1",
                                     "steering_clamps": {"mlp_in": {"3": [entry()]}}}, model=owner.model)
        owner.admit("r1", **kw)
        with owner.stepper() as st:
            st.begin()
            rows = np.zeros((2, HIDDEN), np.float32)
            st.apply("pre_attn", 15, rows, [("r1", 0, 1, "prefill"), ("r1", 1, 2, "decode")])
            np.testing.assert_allclose(rows[0], [0.8] * HIDDEN, rtol=1e-6)
            np.testing.assert_allclose(rows[1], [0.1] * HIDDEN, rtol=1e-6)
            rows = np.zeros((1, HIDDEN), np.float32)
            st.apply("post_attn", 20, rows, [("r1", 0, 1, "decode")])
            np.testing.assert_array_equal(rows[0], [1.0] * HIDDEN)
            rows = np.full((1, HIDDEN), 5.0, np.float32)
            st.apply("mlp_in", 3, rows, [("r1", 0, 1, "decode")])
            assert rows[0][0] == pytest.approx(2.0)  # the projection on axis 0 pinned to 2
            st.end()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_every_packed_dtype(dtype):
    vals = [1.0, -2.0, 0.5, 4.0, 8.0, -16.0, 0.25, 2.0]
    if dtype == "bfloat16":
        raw = b"".join(struct.pack("<H", struct.unpack("<I", struct.pack("<f", v))[0] >> 16) for v in vals)
    else:
        raw = struct.pack(f"<8{ {'float16': 'e', 'float32': 'f', 'float64': 'd'}[dtype]}", *vals)
    blob = {"dtype": dtype, "shape": [1, 8], "layer_indices": [3], "data": base64.b64encode(raw).decode()}
    assert vec(admit(CHAT, steering_vectors={"mlp_out": blob})["override"], "base", "mlp_out", 3) == vals
    with pytest.raises(SteeringRequestError, match="dtype"):
        admit(CHAT, steering_vectors={"mlp_out": {**blob, "dtype": "int8"}})
