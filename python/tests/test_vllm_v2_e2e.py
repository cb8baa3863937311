"""End to end on vLLM's V2 model runner (``VLLM_USE_V2_MODEL_RUNNER=1``): the plugin's V2 wrapping
(``prepare_inputs`` resolves the step's spans and reads the scheduler's version, the model's
forward hooks open and close the step; in static mode ``prepare_inputs`` prepares and
``execute_model`` reports) on the real runner class, ``vllm.v1.worker.cpu.model_runner``, the same
checks as the V1 runner's end-to-end tests:

* eager (tests/vllm_e2e_run.py), dynamic and static: steered greedy tokens and logprobs equal
  transformers with a plain hook, unsteered ones an unsteered run and the same request alone,
  refusals fail one request;
* the concurrent scenario (tests/vllm_e2e_concurrent_run.py: inline, named, clamp, probe gate and
  conversation requests joining and finishing at different steps, chunked prefill);
* every gate scope, dynamic and static (tests/vllm_e2e_gates_run.py);
* under vLLM's ``torch.compile`` (tests/vllm_compile_run.py);
* capture read by the fork's reader (tests/vllm_e2e_capture_run.py);
* tensor parallelism 2 (tests/vllm_e2e_tp_run.py): both ranks at the scheduler's version, equal
  checksums, capture written once by rank 0.

vLLM's CPU build runs the V2 runner only when Triton has a CPU backend (triton-cpu, which the
package index does not serve): each run puts tests/triton_interp on PYTHONPATH, whose
``sitecustomize`` registers one that runs the runner's Triton kernels in Triton's interpreter.
Needs vLLM and Triton importable (docs/vllm.md); skipped otherwise. About 4 minutes here.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Dict, Optional

import pytest

import test_vllm_capture as cap
import test_vllm_capture_tp as tp
import test_vllm_compile_e2e as comp
import test_vllm_concurrent as conc
import test_vllm_e2e as e2e
import test_vllm_gates as gates

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=e2e.NO_VLLM),
              pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                 reason="no Triton here: vLLM's V2 runner needs it (the vLLM environment has it)")]

HERE = os.path.dirname(os.path.abspath(__file__))
V2_RUNNER = "vllm.v1.worker.cpu.model_runner.CPUModelRunner"
V2_LOG = "Using V2 Model Runner"


def v2_env(**more: str) -> Dict[str, str]:
    return {"VLLM_USE_V2_MODEL_RUNNER": "1",
            "PYTHONPATH": os.pathsep.join([os.path.join(HERE, "triton_interp"), os.path.dirname(HERE),
                                           os.environ.get("PYTHONPATH", "")]), **more}


def run_v2(script: str, tmp_path_factory: Any, *args: str, static: bool = False,
           env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    extra = v2_env(**(env or {}))
    if static:
        extra["SHMSTEER_VLLM_STATIC"] = "1"
    return e2e.run_script(script, str(tmp_path_factory.mktemp("tiny-llama")), *args, extra_env=extra, expect_log=V2_LOG)


@pytest.fixture(scope="module", params=["dynamic", "static"])
def eager(request, tmp_path_factory):
    res = run_v2("vllm_e2e_run.py", tmp_path_factory, static=request.param == "static")
    res["mode"] = request.param
    return res


def test_eager(eager):
    v = eager["vllm"]
    assert v["runner"] == V2_RUNNER, v["runner"]
    assert v["hooks_mode"] == ("static" if eager["mode"] == "static" else "native"), v["hooks_mode"]
    e2e.test_unsteered_requests_equal_transformers_and_a_run_alone(eager)
    e2e.test_steered_requests_equal_transformers_with_a_plain_hook(eager)
    e2e.test_the_vectors_change_the_tokens(eager)
    e2e.test_refused_steering_fails_that_request_only(eager)


@pytest.fixture(scope="module")
def concurrent(tmp_path_factory):
    return run_v2("vllm_e2e_concurrent_run.py", tmp_path_factory)


def test_concurrent(concurrent):
    conc.test_every_request_equals_transformers(concurrent)
    conc.test_probe_gated_requests_equal_transformers(concurrent)
    conc.test_steering_changes_the_tokens(concurrent)
    conc.test_requests_join_and_finish_at_different_steps(concurrent)
    conc.test_conversation_turn_without_steering_inherits_it(concurrent)


@pytest.fixture(scope="module", params=["eager", "static"])
def gated(request, tmp_path_factory):
    res = run_v2("vllm_e2e_gates_run.py", tmp_path_factory, "eager", static=request.param == "static")
    res["mode"] = request.param
    return res


def test_gates(gated):
    gates.test_the_model_ran_as_asked(gated)
    gates.test_every_request_equals_transformers(gated)
    for name in ("tt", "ns", "rr", "rc", "an", "ar"):
        gates.test_probe_gate_holds_and_fires(gated, name)
    gates.test_host_scopes_apply_from_the_next_step(gated)
    gates.test_every_gate_changes_the_tokens(gated)
    gates.test_conversation_turn_starts_engaged(gated)
    gates.test_attenuate_with_a_this_token_probe_is_refused(gated)
    gates.test_every_admitted_request_was_ended(gated)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return run_v2("vllm_compile_run.py", tmp_path_factory)


def test_compiled(compiled):
    comp.test_model_ran_compiled_through_the_operator(compiled)
    comp.test_every_request_equals_transformers(compiled)
    comp.test_post_attn_and_mlp_in_equal_transformers(compiled)
    comp.test_steering_changes_the_tokens(compiled)
    comp.test_requests_join_and_finish_at_different_steps(compiled)


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    return run_v2("vllm_e2e_capture_run.py", tmp_path_factory)


def test_capture(captured):
    cap.test_vllm_captured_requests_equal_transformers(captured)
    cap.test_vllm_requests_without_capture_write_nothing(captured)
    cap.test_vllm_steered_request_captures_before_its_vector(captured)
    cap.test_vllm_undeclared_consumer_fails_that_request(captured)


@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory):
    model = str(tmp_path_factory.mktemp("tiny-llama"))
    return {n: e2e.run_script("vllm_e2e_tp_run.py", model, extra_env=v2_env(SHMSTEER_E2E_TP=str(n),
                                                                             VLLM_CPU_OMP_THREADS_BIND="nobind"),
                              expect_log=V2_LOG) for n in (1, 2)}


def test_tensor_parallel(tp_runs):
    assert {r["runner"] for n in (1, 2) for r in tp_runs[n]["ranks"]} == {V2_RUNNER}
    tp.test_tp2_ranks_steer_at_the_same_version(tp_runs)
    tp.test_tp2_outputs_equal_tp1(tp_runs)
    tp.test_tp2_capture_written_once_by_rank0(tp_runs)
