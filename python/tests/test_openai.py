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


def _lists_form(monkeypatch, body, **kw):
    """admission_from_request as it was before binary admission: vector rows as float lists."""
    with monkeypatch.context() as m:
        m.setattr(shmsteer.openai, "_np", None)
        return admission_from_request(body, **kw)


def _random_blob(rng, dtype, layers, hidden):
    vals = rng.standard_normal((len(layers), hidden)) * 0.5
    if dtype == "bfloat16":
        raw = (vals.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    else:
        raw = vals.astype({"float16": "<f2", "float32": "<f4", "float64": "<f8"}[dtype]).tobytes()
    return {"dtype": dtype, "shape": [len(layers), hidden], "layer_indices": list(layers),
            "data": base64.b64encode(raw).decode(), "scales": [0.5 + i for i in range(len(layers))]}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_vector_rows_are_float32_arrays(monkeypatch, dtype):
    """Rows come out as read-only 1-D float32 arrays with the floats the list form gave (float64:
    rounded once, as the engine rounded the lists' floats)."""
    rng = np.random.default_rng(5)
    body = {**CHAT, "steering_vectors": {"pre_attn": _random_blob(rng, dtype, [3, 1], HIDDEN)},
            "decode_steering_vectors": {"mlp_out": _random_blob(rng, dtype, [0], HIDDEN)}}
    new, old = admit(body), _lists_form(monkeypatch, body, model=MODEL)
    assert new.keys() == old.keys() == {"override"}
    for tier in ("base", "decode"):
        nv, ov = new["override"][tier]["vectors"], old["override"][tier]["vectors"]
        assert [(v["hook"], v["layer"], v["scale"]) for v in nv] == [(v["hook"], v["layer"], v["scale"]) for v in ov]
        for a, b in zip(nv, ov):
            d = a["data"]
            assert type(d) is np.ndarray and d.dtype == np.float32 and d.shape == (HIDDEN,)
            assert d.flags.c_contiguous and not d.flags.writeable
            assert isinstance(b["data"], list)
            np.testing.assert_array_equal(d.view(np.uint32), np.array(b["data"], np.float32).view(np.uint32))


def test_float64_ties_round_to_even():
    """A float64 halfway between two float32 rounds to the even one, as serve's Go decoder does."""
    vals = [1 + 2.0 ** -24, 1 + 3 * 2.0 ** -24, -(1 + 2.0 ** -24), 1e300, 1.0, 0.0, -0.0, 2.0 ** -149]
    blob = {"dtype": "float64", "shape": [1, 8], "layer_indices": [0], "data": base64.b64encode(struct.pack("<8d", *vals)).decode()}
    d = admit(CHAT, steering_vectors={"pre_attn": blob})["override"]["base"]["vectors"][0]["data"]
    want = np.array([1.0, 1 + 4 * 2.0 ** -24, -1.0, np.inf, 1.0, 0.0, -0.0, 2.0 ** -149], np.float32)
    np.testing.assert_array_equal(d.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("numpy_rows", [True, False], ids=["arrays", "lists"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_arrays_steer_as_the_lists_did(ns, secret, monkeypatch, dtype, numpy_rows):
    """Admitted through Owner.admit (arrays by address, lists as JSON), both forms add the same
    floats, bit for bit; the arrays take the binary path."""
    from shmsteer.admission import split_override
    rng = np.random.default_rng(6)
    body = {**CHAT, "steering_vectors": {"pre_attn": _random_blob(rng, dtype, [2, 0], HIDDEN)},
            "prefill_steering_vectors": {"pre_attn": _random_blob(rng, dtype, [2], HIDDEN)},
            "decode_steering_vectors": {"post_block": _random_blob(rng, dtype, [5], HIDDEN)}, "conversation_id": "c"}
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=24) as owner:
        kw_new = admission_from_request(body, model=owner.model)
        kw_old = _lists_form(monkeypatch, body, model=owner.model)
        _, vecs, _ = split_override(kw_new["override"], owner._hook_ids(), HIDDEN)
        assert vecs is not None and len(vecs) == 4
        owner.admit("new", **(kw_new if numpy_rows else kw_old))
        owner.admit("old", **kw_old)
        with owner.stepper() as st:
            st.begin()
            for hook, layer in (("pre_attn", 2), ("pre_attn", 0), ("post_block", 5)):
                for phase in ("prefill", "decode"):
                    rows = np.zeros((2, HIDDEN), np.float32)
                    st.apply(hook, layer, rows, [("new", 0, 1, phase), ("old", 1, 2, phase)])
                    assert rows.any() == ((hook, phase) != ("post_block", "prefill"))  # decode tier only
                    np.testing.assert_array_equal(rows[0].view(np.uint32), rows[1].view(np.uint32))
            st.end()


@pytest.mark.parametrize("kw", [
    {"steering_vectors": {"pre_attn": {**pack({0: [1.0] * HIDDEN}), "data": "!!!!"}}},
    {"steering_vectors": {"pre_attn": {**pack({0: [1.0] * HIDDEN}), "shape": [2, HIDDEN]}}},
    {"steering_vectors": {"pre_attn": {**pack({0: [1.0] * HIDDEN}), "dtype": "int8"}}},
    {"steering_vectors": {"pre_attn": {**pack({0: [1.0] * HIDDEN}), "layer_indices": [0, 1]}}},
    {"steering_vectors": {"pre_attn": {**pack({0: [1.0] * HIDDEN}), "scales": [float("inf")]}}},
    {"steering_vectors": {"pre_attn": pack({1: [1.0, 2.0, 3.0]})}},
    {"steering_vectors": {"pre_attn": pack({0: [1.0] * HIDDEN})}, "decode_steering_vectors": {"pre_attn": pack({0: [1.0] * 4})}},
])
def test_refusals_unchanged_by_arrays(monkeypatch, kw):
    with pytest.raises(SteeringRequestError) as new:
        admit(CHAT, **kw)
    with pytest.raises(SteeringRequestError) as old:
        _lists_form(monkeypatch, {**CHAT, **kw}, model=MODEL)
    assert str(new.value) == str(old.value) and new.value.status == old.value.status == 400


@pytest.mark.parametrize("data", ["!!!!", "QUJD=", "QUJ=D", "=QUJD", "QUJDRA===", "QU JD", "QUJ\nD", "caf\u00e9", "QUI"])
def test_base64_refusals_word_as_b64decode(data):
    """Strict binascii first, base64.b64decode(validate=True) for what it refuses: the texts stay."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (ValueError, TypeError) as e:
        want = f"steering_vectors['pre_attn']: SteeringHookPacked.data is not base64: {e}"
    else:
        want = f"SteeringHookPacked.data length {len(raw)} != expected 32 (shape=(1, 8), dtype=float32)"
    with pytest.raises(SteeringRequestError) as err:
        admit(CHAT, steering_vectors={"pre_attn": {**pack({0: [1.0] * HIDDEN}), "data": data}})
    assert str(err.value) == want


@pytest.mark.parametrize("with_numpy", [True, False])
@pytest.mark.parametrize("bad,match", [
    (True, r"\['vector'\]\[3\] must be a finite float, got bool"),
    ("1.0", r"\['vector'\]\[3\] must be a finite float, got str"),
    (None, r"\['vector'\]\[3\] must be a finite float"),
    ([1.0], r"\['vector'\]\[3\] must be a finite float"),
    (float("inf"), "must contain only finite floats"),
    (float("nan"), "must contain only finite floats"),
])
def test_clamp_direction_elements_refused_alike(monkeypatch, with_numpy, bad, match):
    """Each bad element of a clamp direction is named as the fork names it, whether numpy checks
    the list in one pass or Python element by element (without numpy), and nothing is admitted."""
    v = [0.5] * HIDDEN
    v[3] = bad
    body = {**CHAT, "steering_clamps": {"post_block": {"5": [{"vector": v, "value": 1.0}]}}}
    with monkeypatch.context() as m:
        if not with_numpy:
            m.setattr(shmsteer.openai, "_np", None)
        with pytest.raises(SteeringRequestError, match=match):
            admission_from_request(body, model=MODEL)


def test_clamp_direction_same_with_and_without_numpy(monkeypatch):
    """Ints, floats, negative zero and large values give the same direction either way (plain
    Python floats), and an all-zero direction (negative zeros included) is refused either way."""
    v = [1, -0.0, 2.5, -3, 1e300, 7] + [0.25] * (HIDDEN - 6)
    body = {**CHAT, "steering_clamps": {"post_block": {"5": [{"vector": v, "value": 1.0}]}}}
    fast = admission_from_request(body, model=MODEL)["override"]["base"]["clamps"][0]
    slow = _lists_form(monkeypatch, body, model=MODEL)["override"]["base"]["clamps"][0]
    assert fast == slow
    got = fast["dir"]
    assert all(type(x) is float for x in got) and got[:6] == [1.0, -0.0, 2.5, -3.0, 1e300, 7.0]
    zero = {**CHAT, "steering_clamps": {"post_block": {"5": [{"vector": [-0.0, 0] * (HIDDEN // 2), "value": 1.0}]}}}
    for form in (lambda b: admission_from_request(b, model=MODEL), lambda b: _lists_form(monkeypatch, b, model=MODEL)):
        with pytest.raises(SteeringRequestError, match="must be non-zero"):
            form(zero)
