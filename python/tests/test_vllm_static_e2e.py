"""End to end in static mode (``SHMSTEER_VLLM_STATIC=1``: the hooks a CUDA-graph replay steers,
persistent buffers allocated at load before any owner, ``prepare(spans)`` before each forward and
``report()`` after it) on stock vLLM's CPU backend, which has no CUDA graphs: the same checks as
the dynamic plugin's end-to-end tests, each run again with static mode on.

* eager (``-O0``, tests/vllm_e2e_run.py): steered greedy tokens equal transformers with a plain
  hook, unsteered ones an unsteered run and the same request alone; refusals fail one request;
* under vLLM's ``torch.compile`` (tests/vllm_compile_run.py): the concurrent scenario (inline,
  named, clamp, probe gate, conversation; joins and finishes at different steps; chunked
  prefill) and the post_attn / mlp_in requests, every request equal to transformers';
* capture (tests/vllm_e2e_capture_run.py): the captured rows equal transformers' hidden states.

Needs vLLM importable (docs/vllm.md); skipped otherwise. What only a GPU can show (the CUDA graphs
themselves) is in docs/vllm.md.
"""

from __future__ import annotations

import importlib.util

import pytest

import test_vllm_capture as cap
import test_vllm_compile_e2e as comp
import test_vllm_e2e as e2e

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=e2e.NO_VLLM)

STATIC = {"SHMSTEER_VLLM_STATIC": "1"}


@pytest.fixture(scope="module")
def eager(tmp_path_factory):
    return e2e.run_script("vllm_e2e_run.py", str(tmp_path_factory.mktemp("tiny-llama")), extra_env=STATIC)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return comp.run_script("vllm_compile_run.py", str(tmp_path_factory.mktemp("tiny-llama")), extra_env=STATIC)


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    return e2e.run_script("vllm_e2e_capture_run.py", str(tmp_path_factory.mktemp("tiny-llama")), extra_env=STATIC)


def test_eager_static(eager):
    assert eager["vllm"]["hooks_mode"] == "static", eager["vllm"].get("hooks_mode")
    e2e.test_unsteered_requests_equal_transformers_and_a_run_alone(eager)
    e2e.test_steered_requests_equal_transformers_with_a_plain_hook(eager)
    e2e.test_the_vectors_change_the_tokens(eager)
    e2e.test_refused_steering_fails_that_request_only(eager)


def test_compiled_static(compiled):
    c = compiled["compiled"]
    assert c["hooks_mode"] == "static" and c["sites_static"], c
    comp.test_model_ran_compiled_through_the_operator(compiled)
    comp.test_every_request_equals_transformers(compiled)
    comp.test_post_attn_and_mlp_in_equal_transformers(compiled)
    comp.test_steering_changes_the_tokens(compiled)
    comp.test_requests_join_and_finish_at_different_steps(compiled)


def test_capture_static(captured):
    assert captured["vllm"]["hooks_mode"] == "static", captured["vllm"].get("hooks_mode")
    cap.test_vllm_captured_requests_equal_transformers(captured)
    cap.test_vllm_requests_without_capture_write_nothing(captured)
    cap.test_vllm_steered_request_captures_before_its_vector(captured)
    cap.test_vllm_undeclared_consumer_fails_that_request(captured)
