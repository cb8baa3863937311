"""The concurrent end-to-end scenario (vllm_e2e_concurrent_run.py: fifteen requests in five
steering configurations joining and finishing at different steps, transformers with plain hooks
beside) with vLLM's ``torch.compile`` on: ``LLM(..., enforce_eager=False,
compilation_config={"mode": 3})``, which vLLM's CPU backend runs as ``DYNAMO_TRACE_ONCE`` with
inductor (no CUDA graphs on the CPU). Prints one JSON line: the scenario's results plus what vLLM
compiled (mode, backend, cudagraph mode, compile time) and the calls the compiled graph made to
``torch.ops.shmsteer.vllm_site_`` in steps.

Run by test_vllm_compile_e2e.py in a fresh interpreter of the environment that has vLLM. By hand::

    VLLM_CPU_KVCACHE_SPACE=1 python3 python/tests/vllm_compile_run.py /tmp/model-dir
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict

import torch

import vllm_e2e_concurrent_run as scenario
from vllm_e2e_run import make_model

_seen: Dict[str, Any] = {"llm": None, "op_calls": 0}


def _compiled_llm() -> None:
    """Make the scenario's ``LLM(...)`` (imported from vllm inside its run_vllm) a compiled one."""
    import vllm

    class CompiledLLM(vllm.LLM):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.update(enforce_eager=False, compilation_config={"mode": 3})
            super().__init__(*args, **kwargs)
            _seen["llm"] = self

    vllm.LLM = CompiledLLM


def _count_op_calls() -> None:
    """Count the steps' site applies that come through the operator (compiled sites only)."""
    from shmsteer.vllm.layers import LayerSites
    orig = LayerSites.run

    def run(self: LayerSites, t: Any, hook: int, layer: int) -> None:
        if self.compiled and self.active:
            _seen["op_calls"] += 1
        orig(self, t, hook, layer)

    LayerSites.run = run  # type: ignore[method-assign]


def compiled_facts() -> Dict[str, Any]:
    llm = _seen["llm"]
    core = llm.llm_engine.engine_core.engine_core
    runner = core.model_executor.driver_worker.worker.model_runner
    cc = runner.vllm_config.compilation_config
    sites = runner.__dict__.get("_shmsteer_sites")
    st = runner.__dict__.get("_shmsteer")
    from vllm.compilation.counter import compilation_counter
    dyn = torch._dynamo.utils.counters
    return {"aot_compiles": compilation_counter.num_aot_compiles,
            "aot_loaded": compilation_counter.num_aot_artifacts_loaded,
            "dynamo_graphs": int(dyn["stats"]["unique_graphs"]), "graph_breaks": int(sum(dyn["graph_break"].values())),
            "additional_config": dict(runner.vllm_config.additional_config),
            "mode": getattr(cc.mode, "name", str(cc.mode)), "backend": cc.backend,
            "cudagraph_mode": getattr(cc.cudagraph_mode, "name", str(cc.cudagraph_mode)),
            "compilation_time_s": float(getattr(cc, "compilation_time", 0.0) or 0.0),
            "sites_compiled": bool(sites is not None and sites.compiled),
            "sites_bound": 0 if sites is None else len(sites.sites),
            "steps": None if st is None else st.steps, "op_calls": _seen["op_calls"]}


def main() -> None:
    path = sys.argv[1]
    if not os.path.exists(os.path.join(path, "config.json")):
        make_model(path)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the worker here: its runner is read
    _compiled_llm()
    _count_op_calls()
    res: Dict[str, Any] = {"vllm": scenario.run_vllm(path)}
    res["compiled"] = compiled_facts()
    res["hf"] = scenario.run_hf(path)
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
