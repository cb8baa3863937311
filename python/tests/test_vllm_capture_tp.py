"""Tensor parallelism on vLLM's CPU backend (tensor_parallel_size=2), steered and captured.

tests/vllm_e2e_tp_run.py runs the same four requests (two steered, two captured, one neither) at
TP 1 and TP 2, each in a fresh interpreter: at TP 2 both ranks steer every step at the version
the scheduler handed them (it travels with the batch as ``SchedulerOutput.shmsteer_version``),
their last steps' checksums agree, only rank 0 writes capture records, and each captured
position is written once; the tokens equal TP 1's and the logprobs and captured rows agree
within float32's tolerance (TP 2 sums its all-reduce in another order).

vLLM's CPU backend binds each rank's OpenMP threads to a NUMA node of its own by default and
refuses TP 2 on a one-node machine ("Not enough allowed NUMA nodes to bind threads of 2 local
CPUWorkers"): the run sets ``VLLM_CPU_OMP_THREADS_BIND=nobind``. About 5 minutes on the 2-core
VM (TP 2 spawns two workers, each importing vLLM).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

NO_VLLM = "vllm is not importable in this interpreter (bash .ci/pyenv-vllm makes one that has it; docs/vllm.md)"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=NO_VLLM)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, monkeypatch_module):
    from test_vllm_e2e import run_script
    monkeypatch_module.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    model = str(tmp_path_factory.mktemp("tiny-llama"))
    out = {}
    for tp in (1, 2):
        monkeypatch_module.setenv("SHMSTEER_E2E_TP", str(tp))
        out[tp] = run_script("vllm_e2e_tp_run.py", model)
    return out


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_tp2_ranks_steer_at_the_same_version(runs):
    r1, r2 = runs[1]["ranks"], runs[2]["ranks"]
    assert len(r1) == 1 and len(r2) == 2, (r1, r2)
    a, b = r2
    assert (a["rank"], b["rank"]) == (0, 1)
    assert a["steps"] == b["steps"] == r1[0]["steps"] > 0, (a, b, r1)
    assert a["version"] == b["version"] > 0, "the scheduler's version reached both ranks"
    assert a["checksum"] != 0, "the last step steered rows"
    # Equal across ranks; not comparable with TP 1's run, whose request ids (vLLM's random
    # suffixes) differ.
    assert (a["checksum"], a["batch_checksum"]) == (b["checksum"], b["batch_checksum"])


def test_tp2_outputs_equal_tp1(runs):
    t1, t2 = runs[1], runs[2]
    assert t2["tokens"] == t1["tokens"]
    for a, b in zip(t1["logprobs"], t2["logprobs"]):
        assert np.allclose(a, b, atol=2e-3), (a, b)


def test_tp2_capture_written_once_by_rank0(runs):
    from vllm_e2e_tp_run import CASES
    from vllm_e2e_run import MAX_TOKENS, PROMPTS
    t1, t2 = runs[1], runs[2]
    assert [r["writes"] for r in t2["ranks"]] == [True, False]
    assert t1["fs_stats"]["records"] == t2["fs_stats"]["records"] > 0, (t1["fs_stats"], t2["fs_stats"])
    assert set(t2["files"]) == set(t1["files"]) == {f"e2e/tp-{i}" for i, c in enumerate(CASES) if c[2] is not None}
    for d, sites in t2["files"].items():
        p = PROMPTS[CASES[int(d.rsplit("-", 1)[1])][0]]
        for site, g in sites.items():
            assert g["positions"] == list(range(len(p) + MAX_TOKENS - 1)), (d, site)  # each once
            np.testing.assert_allclose(np.asarray(g["data"]), np.asarray(t1["files"][d][site]["data"]),
                                       rtol=1e-4, atol=1e-4, err_msg=f"{d} {site}")
