"""End to end under vLLM's torch.compile: stock vLLM's CPU build with ``compilation_config={"mode":
3}`` (run by vLLM's CPU backend as ``DYNAMO_TRACE_ONCE`` with inductor), steered by the plugin's
compiled sites, against transformers.

The scenario of test_vllm_concurrent.py (fifteen requests: inline, named, clamp, probe gate and
conversation configurations plus unsteered ones, joining and finishing at different steps,
chunked prefill) with the model compiled. Every request's greedy tokens must equal transformers'
with plain hooks doing the same, which the eager plugin also equals (test_vllm_concurrent.py):
the compiled plugin's tokens are the eager plugin's. The run must have compiled (a Dynamo mode,
no CUDA graphs), attached the compiled sites at load and steered through the operator.

Needs vLLM importable (docs/vllm.md); skipped otherwise. vLLM runs in a fresh interpreter
(tests/vllm_compile_run.py).
"""

from __future__ import annotations

import importlib.util

import pytest

from test_vllm_e2e import NO_VLLM, run_script

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=NO_VLLM)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return run_script("vllm_compile_run.py", str(tmp_path_factory.mktemp("tiny-llama")))


def test_model_ran_compiled_through_the_operator(result):
    c = result["compiled"]
    assert c["mode"] in ("DYNAMO_TRACE_ONCE", "VLLM_COMPILE"), c
    assert c["cudagraph_mode"] == "NONE", c
    assert c["aot_compiles"] + c["aot_loaded"] == 1 and c["graph_breaks"] == 0, c  # one graph, compiled or loaded
    assert c["additional_config"].get("shmsteer_vllm"), "the compile cache is keyed by the compiled sites"
    assert c["sites_compiled"] and c["sites_bound"] == 10, c  # five hook points x two layers
    assert c["steps"] > 10, c
    assert c["op_calls"] == c["sites_bound"] * c["steps"], "every site of every step through the operator"


def test_every_request_equals_transformers(result):
    v, hf = result["vllm"], result["hf"]
    assert sorted(v["tokens"]) == sorted(hf["tokens"]), "every request finished"
    for name, toks in hf["tokens"].items():
        assert v["tokens"][name] == toks, f"request {name} ({hf['configs'][name]})"


def test_post_attn_and_mlp_in_equal_transformers(result):
    """The hook points the scenario leaves out: post_attn (the norm's pre-hook, the fold with a
    zero residual) and mlp_in (the MLP's input, mutated in place in the graph)."""
    v, hf = result["more_vllm"], result["more_hf"]
    assert sorted(v) == sorted(hf["tokens"]) == ["mi0", "mi1", "pa0", "pa1"]
    for name, toks in hf["tokens"].items():
        assert v[name] == toks, name
        assert toks != hf["unsteered"][name], f"{name}: the vector changes nothing"


def test_steering_changes_the_tokens(result):
    hf = result["hf"]
    steered = [n for n, cfg in hf["configs"].items() if cfg is not None]
    assert len(steered) >= 12
    for name in steered:
        assert hf["tokens"][name] != hf["unsteered"][name], f"request {name}: {hf['configs'][name]} changes nothing"


def test_requests_join_and_finish_at_different_steps(result):
    v = result["vllm"]
    assert len(set(v["joined"].values())) >= 4 and len(set(v["finished"].values())) >= 4
    assert v["live_after"] == {}, "every admitted request was ended"
