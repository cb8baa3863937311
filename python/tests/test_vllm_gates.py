"""End to end, declarative gates: stock vLLM's CPU build steered by the shmsteer plugin, every
gate scope (this_token, next_step, rest_of_request, rest_of_conversation) and both apply kinds
(add, attenuate) in one ``LLM.generate`` batch, against transformers with the gate computed by
hand (tests/vllm_e2e_gates_run.py has the rules and the requests).

Each probe gate's threshold is chosen from transformers' own probe scores so that the gate
holds at some decode steps and fires at others, and so that it changes the request's tokens;
the reference's decisions are asserted here, so the equalities cannot hold with the gate off.

Each test runs three times: vLLM eager, under vLLM's torch.compile (the plugin's compiled sites),
and eagerly in static mode (``SHMSTEER_VLLM_STATIC=1``).
Needs vLLM importable (docs/vllm.md); skipped otherwise. vLLM runs in a fresh interpreter.
"""

from __future__ import annotations

import importlib.util

import pytest

from test_vllm_e2e import NO_VLLM, run_script

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=NO_VLLM)

LOGPROB_TOL = 1e-4  # float32; the largest difference measured: 1.0e-6


@pytest.fixture(scope="module", params=["eager", "compile", "static"])
def result(request, tmp_path_factory):
    """The run eagerly (``-O0``), under vLLM's torch.compile (the plugin's compiled sites) and
    eagerly in static mode (``SHMSTEER_VLLM_STATIC=1``: the gates' persistent buffers)."""
    static = request.param == "static"
    res = run_script("vllm_e2e_gates_run.py", str(tmp_path_factory.mktemp("tiny-llama")),
                     "eager" if static else request.param, extra_env={"SHMSTEER_VLLM_STATIC": "1"} if static else None)
    res["mode"] = request.param
    return res


def test_the_model_ran_as_asked(result):
    c = result["vllm"]["compiled"]
    if result["mode"] == "compile":
        assert c["mode"] == "DYNAMO_TRACE_ONCE" and c["sites_compiled"], c
    else:
        assert c["mode"] == "NONE" and not c["sites_compiled"], c
    assert (c["hooks_mode"] == "static") == (result["mode"] == "static"), c
    assert c["steps"] > 10, c


def _gate(name: str):
    from vllm_e2e_gates_run import REQS, TURN2
    return REQS["rc" if name == TURN2[0] else name][3]


def test_every_request_equals_transformers(result):
    v, hf = result["vllm"], result["hf"]
    assert sorted(v["tokens"]) == sorted(hf), "every request finished"
    for name, r in hf.items():
        assert v["tokens"][name] == r["ref"]["tokens"], f"request {name} gate {_gate(name)} thr {r['thr']}"
        for i, (a, b) in enumerate(zip(v["logprobs"][name], r["ref"]["logprobs"])):
            assert abs(a - b) < LOGPROB_TOL, f"request {name} token {i}: logprob {a} vs {b}"


@pytest.mark.parametrize("name", ["tt", "ns", "rr", "rc", "an", "ar"])
def test_probe_gate_holds_and_fires(result, name):
    """The reference's gate holds at some decode steps and fires at others, so vLLM's equality
    above checks both decisions."""
    fired = result["hf"][name]["ref"]["fired"]
    assert any(fired) and not all(fired), fired


def test_host_scopes_apply_from_the_next_step(result):
    """next_step engages on the step after each firing only; rest_of_request from the step after
    the first firing to the end (the reference's own bookkeeping, read back)."""
    for name in ("ns", "an"):
        ref = result["hf"][name]["ref"]
        assert ref["engaged"] == [False] + ref["fired"][:-1], name
    for name in ("rr", "ar", "rc"):
        ref = result["hf"][name]["ref"]
        first = ref["fired"].index(True)
        assert ref["engaged"] == [i > first for i in range(len(ref["fired"]))], name


def test_every_gate_changes_the_tokens(result):
    """Without this the equalities could hold with gates silently off: each gated request's
    tokens differ from the same request with its gate inert (its own steering kept)."""
    hf = result["hf"]
    for name, r in hf.items():
        if _gate(name) is None:
            assert r["ref"]["tokens"] == r["base"]["tokens"]
        elif "base" in r:
            assert r["ref"]["tokens"] != r["base"]["tokens"], f"request {name}: its gate changes nothing"
    assert hf["o0"]["ref"]["tokens"] != hf["o0"]["unsteered"], "the attenuated vector steers"
    assert hf["u0"]["ref"]["tokens"] == hf["u0"]["unsteered"] == result["vllm"]["tokens"]["u0"]


def test_conversation_turn_starts_engaged(result):
    """rest_of_conversation: the first turn's gate engaged, so the second turn, which carries
    only the conversation id, inherits the gate engaged from its first decode step; the same
    gate evaluated afresh gives other tokens."""
    v, hf = result["vllm"], result["hf"]
    assert any(hf["rc"]["ref"]["fired"])
    r2 = hf["rc2"]
    assert all(r2["ref"]["engaged"]) and r2["ref"]["tokens"] != r2["fresh"]["tokens"]
    assert v["tokens"]["rc2"] == r2["ref"]["tokens"]


def test_attenuate_with_a_this_token_probe_is_refused(result):
    """A gate the owner refuses (attenuate × this_token × probe, steer.ErrGateUnsupported) is
    refused by the frontend's check: LLM.generate raises the engine's typed error (also vLLM's
    VLLMValidationError, a 400 over HTTP) with its text, the request never reaches the engine
    (nothing logged, no output), and the next request is served as usual."""
    refused, hf = result["vllm"]["refused"], result["hf"]
    assert refused["raised"] is not None, refused
    assert "GateUnsupportedError" in refused["raised"] and "VLLMValidationError" in refused["raised"], refused
    assert refused["message"].startswith("steering[0]: shmsteer: unsupported steering gate: attenuate with "
                                         "when=probe and scope=this_token"), refused
    assert refused["finish_reason"] is None and refused["logged"] == [], refused
    assert refused["other"] == hf["u0"]["unsteered"][:4]


def test_every_admitted_request_was_ended(result):
    assert result["vllm"]["live_after"] == {}
