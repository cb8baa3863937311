"""End to end, concurrent: stock vLLM's CPU build steered by the shmsteer plugin through one
``LLMEngine`` step loop, against transformers.

Fifteen requests in five steering configurations: a packed inline vector at post_block L0, a
named vector registered through a ``shmsteer.Client`` at mlp_out L1, a clamp setting a projection
at post_block L1, a this_token probe gate (probe at post_block L0, a named vector added at
post_block L1 on decode rows, times the gate), and a conversation's first turn with an inline
vector at pre_attn L1; plus unsteered ones. Prompts of 5 to 20 tokens, 5 to 10 new tokens, nine
added at step 0 and five at steps 2 to 6, chunked prefill at 48 batched tokens: they join and
finish at different steps. The conversation's second turn, added once the first has finished,
carries only ``conversation_id`` and must inherit the first turn's steering. Every request's
greedy tokens must equal transformers' with plain hooks doing the same at the same points;
unsteered ones equal transformers unsteered.

Needs vLLM importable (docs/vllm.md); skipped otherwise. vLLM runs in a fresh interpreter
(tests/vllm_e2e_concurrent_run.py).
"""

from __future__ import annotations

import importlib.util

import pytest

from test_vllm_e2e import NO_VLLM, run_script

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=NO_VLLM)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return run_script("vllm_e2e_concurrent_run.py", str(tmp_path_factory.mktemp("tiny-llama")))


def test_every_request_equals_transformers(result):
    v, hf = result["vllm"], result["hf"]
    assert sorted(v["tokens"]) == sorted(hf["tokens"]), "every request finished"
    for name, toks in hf["tokens"].items():
        assert v["tokens"][name] == toks, f"request {name} ({hf['configs'][name]})"


def test_probe_gated_requests_equal_transformers(result):
    """this_token: each decode row gets g = sigmoid(sharpness·(h·probe − threshold)) times the
    add at the sites after the probe (torch_hook.py, steer/gates_step.go); prefill rows none."""
    v, hf = result["vllm"], result["hf"]
    g = [x for name in hf["gates"] for x in hf["gates"][name]]
    assert min(g) < 0.5 < max(g), f"the reference gate both holds and fires: {g}"
    for name in hf["gates"]:
        assert v["tokens"][name] == hf["tokens"][name], f"gated request {name}: gates {hf['gates'][name]}"


def test_steering_changes_the_tokens(result):
    """Without this the equalities above could hold with steering silently off."""
    hf = result["hf"]
    for name, cfg in hf["configs"].items():
        if cfg is None:
            assert hf["tokens"][name] == hf["unsteered"][name]
        else:
            assert hf["tokens"][name] != hf["unsteered"][name], f"request {name}: {cfg} changes nothing"


def test_requests_join_and_finish_at_different_steps(result):
    v = result["vllm"]
    assert len(set(v["joined"].values())) >= 4, v["joined"]
    assert len(set(v["finished"].values())) >= 4, v["finished"]
    assert len(v["tokens"]) >= 15
    assert v["live_after"] == {}, "every admitted request was ended"


def test_conversation_turn_without_steering_inherits_it(result):
    v, hf = result["vllm"], result["hf"]
    assert v["joined"]["d1"] >= v["finished"]["d0"]
    assert v["tokens"]["d1"] == hf["tokens"]["d1"] != hf["unsteered"]["d1"]
