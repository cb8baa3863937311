"""End to end: stock vLLM's CPU build steered by the shmsteer plugin, against transformers.

A batch of six requests (prompts of 5 to 20 tokens; chunked prefill with 32 batched tokens) where
four are steered at different hook points and layers (post_block, pre_attn, mlp_out, mlp_in; the
fork's packed vectors as the JSON text of vllm_xargs) and two are not. Each steered request's
greedy tokens must equal those of the same weights in transformers with the vector added by a
plain hook at the same point, its logprobs within float32's tolerance; the unsteered requests
must equal transformers' unsteered run and the same request run alone in vLLM.

Needs vLLM importable in the running interpreter (the project's test venv has none: the
environment .ci/pyenv-vllm makes, see docs/vllm.md); skipped with the reason otherwise.
vLLM runs in a fresh interpreter (tests/vllm_e2e_run.py): an engine is built once per process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from typing import Dict, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

NO_VLLM = "vllm is not importable in this interpreter (bash .ci/pyenv-vllm makes one that has it; docs/vllm.md)"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=NO_VLLM)


def entry_point_installed() -> bool:
    from importlib.metadata import entry_points
    return any(ep.value == "shmsteer.vllm:register" for ep in entry_points(group="vllm.general_plugins"))


def run_script(script: str, model: str, *args: str, extra_env: Optional[Dict[str, str]] = None,
               expect_log: Optional[str] = None) -> dict:
    """Runs tests/<script> on model (and args) in a fresh interpreter (an engine is built once
    per process), with ``extra_env`` set there, and returns its RESULT line's JSON; with
    ``expect_log``, that text must appear in the run's output (vLLM's log)."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               PYTHONPATH=os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("SHMSTEER_NAMESPACE", "SHMSTEER_SECRET", "SHMSTEER_SECRET_FILE", "SHMSTEER_VLLM_STATIC"):
        env.pop(k, None)
    env.update(extra_env or {})
    # Installed (.ci/pyenv-vllm installs it), vLLM loads the plugin through its entry point.
    env["SHMSTEER_E2E_ENTRY_POINT"] = "1" if entry_point_installed() else "0"
    p = subprocess.run([sys.executable, os.path.join(HERE, script), model, *args], env=env,
                       capture_output=True, text=True, timeout=1500)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"rc {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}"
    if expect_log is not None:
        assert expect_log in p.stdout + p.stderr, f"{script}: no {expect_log!r} in its output\n{p.stdout[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return run_script("vllm_e2e_run.py", str(tmp_path_factory.mktemp("tiny-llama")))


def test_unsteered_requests_equal_transformers_and_a_run_alone(result):
    from vllm_e2e_run import STEER
    v, hf = result["vllm"], result["hf"]
    for i, s in enumerate(STEER):
        if s is None:
            assert v["tokens"][i] == hf["tokens"][i], f"request {i}"
    assert v["tokens"][1] == v["alone"]


def test_steered_requests_equal_transformers_with_a_plain_hook(result):
    from vllm_e2e_run import STEER
    v, hf = result["vllm"], result["hf"]
    for i, s in enumerate(STEER):
        assert v["tokens"][i] == hf["tokens"][i], f"request {i} steered {s}"
        for a, b in zip(v["logprobs"][i], hf["logprobs"][i]):
            assert abs(a - b) < 2e-3, f"request {i} steered {s}: logprob {a} vs {b}"


def test_the_vectors_change_the_tokens(result):
    """Without this the equalities above could hold with steering silently off."""
    from vllm_e2e_run import STEER
    hf = result["hf"]
    for i, s in enumerate(STEER):
        if s is not None:
            assert hf["tokens"][i] != hf["unsteered"][i], f"request {i}: the vector {s} changes nothing"
    assert isinstance(result["vllm"]["steps"], int) and result["vllm"]["steps"] > 0, result["vllm"]["steps"]
    assert result["vllm"]["live_after"] == {}, "every admitted request was ended"


def test_refused_steering_fails_that_request_only(result):
    v = result["vllm"]
    assert v["refused_frontend"] and "model hidden size" in v["refused_frontend"], v["refused_frontend"]
    ro = v["refused_owner"]
    assert ro is not None and (isinstance(ro, str) or ro["finish_reason"] == "error"), ro
    assert v["after_refusals"] == v["alone"]
