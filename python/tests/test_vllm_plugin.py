"""shmsteer.vllm below the engine: the span builder, the translation of extra_args, the
admissions against a real Owner, the hook points on a toy layer of vLLM's shape, and the plugin's
switch. None of these needs vLLM; test_vllm_classes.py runs them against vLLM's own classes."""

from __future__ import annotations

import base64
import json
import struct

import numpy as np
import pytest
import torch

import shmsteer
from shmsteer.openai import SteeringRequestError
from shmsteer.vllm import BatchLayoutError, PluginConfigError, UnsupportedModelError, enabled
from shmsteer.vllm.layers import LayerSites, decoder_layers
from shmsteer.vllm.requests import Admissions, admission_for, steering_body
from shmsteer.vllm.spans import build_spans

HIDDEN = 8


def pack(layers, hidden=HIDDEN):
    idx = sorted(layers)
    raw = b"".join(struct.pack(f"<{hidden}f", *layers[i]) for i in idx)
    return {"dtype": "float32", "shape": [len(idx), hidden], "layer_indices": idx,
            "data": base64.b64encode(raw).decode("ascii")}


# ---- spans ---------------------------------------------------------------------------------

def test_spans_mixed_batch_with_padding():
    # a decode, a chunk of a chunked prefill, a prompt's last chunk; 2 padding rows
    spans = build_spans(["d", "c", "p"], [0, 1, 5, 8], [9, 4, 10], [6, 16, 13], rows=10)
    assert spans == [("d", 0, 1, "decode", 9), ("c", 1, 5, "prefill", 4), ("p", 5, 8, "prefill", 10)]


def test_spans_recompute_splits_at_prompt_end():
    # a preempted request recomputes its 4-token prompt and 2 generated tokens in one chunk
    assert build_spans(["r"], [0, 6], [0], [4], rows=6) == [("r", 0, 4, "prefill", 0), ("r", 4, 6, "decode", 4)]


def test_spans_skip_empty_and_read_only_n_entries():
    qsl = np.array([0, 0, 2, 2, 2], dtype=np.int32)  # entries past n+1 are the runner's padding
    assert build_spans(["a", "b"], qsl, [3, 5], [3, 1], rows=4) == [("b", 0, 2, "decode", 5)]


@pytest.mark.parametrize("args", [
    (["a", "b"], [0, 1], [0, 0], [1, 1], 4),  # too few offsets
    (["a"], [1, 2], [0], [1], 4),  # not starting at 0
    (["a", "b"], [0, 3, 2], [0, 0], [1, 1], 4),  # decreasing
    (["a"], [0, 5], [0], [1], 4),  # past the rows
    (["a"], [0, 1], [-1], [1], 4),  # negative position
])
def test_spans_refuse_bad_layouts(args):
    with pytest.raises(BatchLayoutError):
        build_spans(*args)


# ---- requests -------------------------------------------------------------------------------

def test_steering_body_decodes_json_strings_and_keeps_only_steering_fields():
    blob = pack({1: [1.0] * HIDDEN})
    extra = {"steering_vectors": json.dumps({"post_block": blob}), "conversation_id": "c1", "other_plugin": "x"}
    assert steering_body(extra) == {"steering_vectors": {"post_block": blob}, "conversation_id": "c1"}
    assert steering_body({"steering_vectors": {"post_block": blob}}) == {"steering_vectors": {"post_block": blob}}
    assert steering_body(None) == {} and steering_body({"seed_like": 3}) == {}


def test_steering_body_bad_json_is_a_400():
    with pytest.raises(SteeringRequestError) as e:
        steering_body({"steering_clamps": "{not json"})
    assert e.value.status == 400 and "steering_clamps" in str(e.value)


def test_admission_for_translates_with_the_forks_checks():
    model = (HIDDEN, 4, list(shmsteer.openai.DEFAULT_HOOKS))
    kw = admission_for({"steering_vectors": json.dumps({"post_block": pack({2: [0.5] * HIDDEN})}),
                        "capture": json.dumps({"fs": {"request_id": "r", "hooks": {"post_block": [2]}}})}, 7, model)
    assert kw["override"]["base"]["vectors"][0]["layer"] == 2
    assert kw["capture"] == {"fs": {"request_id": "r", "hooks": {"post_block": [2]}}} and kw["prompt_len"] == 7
    assert admission_for({"unrelated": 1}, 3, model) is None
    with pytest.raises(SteeringRequestError, match="model hidden size"):
        admission_for({"steering_vectors": {"post_block": pack({2: [0.5] * 4}, hidden=4)}}, 3, model)
    with pytest.raises(SteeringRequestError, match="capture"):
        admission_for({"capture": "[1]"}, 3, model)


def test_admissions_admit_steer_and_end(ns, secret):
    with shmsteer.Owner(ns, secret, hidden=HIDDEN, layers=4) as owner:
        adm = Admissions(owner)
        blob = pack({1: [float(i) for i in range(HIDDEN)]})
        assert adm.admit("req-1-abcd1234", {"steering_vectors": json.dumps({"post_block": blob})}, 3, "req-1")
        assert not adm.admit("req-2-ffff0000", {}, 3)
        assert adm.live() == {"req-1-abcd1234": "req-1"} and adm.external_id("req-1-abcd1234") == "req-1"
        rows = np.zeros((2, HIDDEN), np.float32)
        with owner.stepper() as st:
            st.begin()
            st.apply("post_block", 1, rows, [("req-1-abcd1234", 0, 1, "prefill"), ("req-2-ffff0000", 1, 2, "prefill")])
            st.end()
        np.testing.assert_array_equal(rows[0], np.arange(HIDDEN, dtype=np.float32))
        np.testing.assert_array_equal(rows[1], 0)
        assert adm.end("req-1-abcd1234") and not adm.end("req-1-abcd1234") and adm.live() == {}
        rows[:] = 0
        with owner.stepper() as st:
            st.begin()
            st.apply("post_block", 1, rows, [("req-1-abcd1234", 0, 1, "prefill")])
            st.end()
        np.testing.assert_array_equal(rows, 0)


def test_admissions_refusal_admits_nothing(ns, secret):
    with shmsteer.Owner(ns, secret, hidden=HIDDEN, layers=4) as owner:
        adm = Admissions(owner)
        with pytest.raises(SteeringRequestError):
            adm.admit("r", {"steering_vectors": {"post_block": pack({1: [1.0] * 4}, hidden=4)}}, 3)  # width 4 of 8
        with pytest.raises(shmsteer.errors.LayerRangeError):
            adm.admit("r", {"steering_vectors": {"post_block": pack({9: [1.0] * HIDDEN})}}, 3)  # layer 9 of 4
        assert adm.live() == {}
        assert adm.admit("r", {"steering_vectors": {"post_block": pack({1: [1.0] * HIDDEN})}}, 3)


# ---- hook points on vLLM's layer contract ---------------------------------------------------

class _Norm(torch.nn.Module):
    """vLLM's RMSNorm contract: norm(x) or, with a residual, (norm(x + r), x + r)."""

    def forward(self, x, residual=None):
        if residual is None:
            return x * 2.0
        s = x + residual
        return s * 2.0, s


class LlamaDecoderLayer(torch.nn.Module):
    """A stand-in with vLLM's decoder-layer contract (class name as vLLM's; linear pieces)."""

    def __init__(self):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = _Norm(), _Norm()
        self.self_attn = torch.nn.Identity()
        self.mlp = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        torch.nn.init.eye_(self.mlp.weight)
        self.mlp.weight.data *= 3.0

    def forward(self, positions, hidden_states, residual):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class _Inner(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = torch.nn.ModuleList(LlamaDecoderLayer() for _ in range(n))
        self.norm = _Norm()

    def forward(self, x):
        h, r = x, None
        for layer in self.layers:
            h, r = layer(None, h, r)
        return self.norm(h, r)[1]  # the final stream


class _Model(torch.nn.Module):
    def __init__(self, n=2):
        super().__init__()
        self.model = _Inner(n)

    def forward(self, x):
        return self.model(x)


def _run(hook, layer, x, add, n=2):
    """The final stream with `add` added at (hook, layer) through LayerSites, and the site's
    tensor as the apply saw it."""
    m = _Model(n)
    seen = {}

    def apply(t, hid, idx):
        seen[(hid, idx)] = t.clone()
        t.add_(add)

    sites = LayerSites(m, apply, {"pre_attn": 0, "post_attn": 1, "mlp_in": 2, "mlp_out": 3, "post_block": 4}.get,
                       hooks=[hook], layers=[layer])
    sites.active = True
    out = m(x.clone())
    sites.active = False
    assert m(x.clone()).equal(_Model(n)(x.clone()))  # inactive: untouched
    return out, seen


def _reference(hook, layer, x, add, n=2):
    """The same network written with the stream explicit, the add at the hook point."""
    h = x.clone()
    for i in range(n):
        def at(name, t):
            return t + add if (name, i) == (hook, layer) else t
        h = at("pre_attn", h)
        a = h * 2.0  # input norm, identity attention
        h = at("post_attn", h + a)
        m_in = at("mlp_in", h * 2.0)
        m_out = at("mlp_out", m_in * 3.0)
        h = at("post_block", h + m_out)
    return h


@pytest.mark.parametrize("hook", ["pre_attn", "post_attn", "mlp_in", "mlp_out", "post_block"])
@pytest.mark.parametrize("layer", [0, 1])
def test_layer_sites_steer_the_hook_points(hook, layer):
    x = torch.randn(3, HIDDEN)
    add = torch.randn(HIDDEN)
    out, seen = _run(hook, layer, x, add)
    torch.testing.assert_close(out, _reference(hook, layer, x, add))
    assert not out.equal(_reference(hook, layer, x, torch.zeros(HIDDEN)))  # the add changed something


def test_post_block_applies_to_the_stream_not_the_branch():
    x = torch.randn(3, HIDDEN)
    _, seen = _run("post_block", 0, x, torch.zeros(HIDDEN))
    # the stream after layer 0: x + 2x (attention) = 3x, then + 3 * 2 * 3x (mlp) = 21x
    torch.testing.assert_close(seen[(4, 0)], 21.0 * x)


def test_decoder_layers_refuses_unknown_layers():
    m = _Model(1)
    m.model.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    with pytest.raises(UnsupportedModelError):
        decoder_layers(m)
    with pytest.raises(UnsupportedModelError):
        LayerSites(_Model(1), lambda *a: None, lambda h: 0, hooks=["attn_out"])


def test_plugin_switch_and_settings(monkeypatch):
    monkeypatch.delenv("SHMSTEER_VLLM", raising=False)
    assert not enabled()
    monkeypatch.setenv("SHMSTEER_VLLM", "1")
    assert enabled()
    from shmsteer.vllm import engine
    monkeypatch.setenv("SHMSTEER_VLLM_OWNER", "elsewhere")
    with pytest.raises(PluginConfigError):
        engine.owner_mode()
    monkeypatch.setenv("SHMSTEER_NAMESPACE", "prod")
    assert engine.namespace(1, 2) == "prod-dp1" and engine.namespace() == "prod"
