"""The concurrent end-to-end scenario (vllm_e2e_concurrent_run.py: fifteen requests in five
steering configurations joining and finishing at different steps, transformers with plain hooks
beside) with vLLM's ``torch.compile`` on: ``LLM(..., enforce_eager=False,
compilation_config={"mode": 3})``, which vLLM's CPU backend runs as ``DYNAMO_TRACE_ONCE`` with
inductor (no CUDA graphs on the CPU). Prints one JSON line: the scenario's results plus what vLLM
compiled (mode, backend, cudagraph mode, compile time) and the calls the compiled graph made to
``torch.ops.shmsteer.vllm_site_`` in steps; then four more requests, at the two hook points the
scenario does not steer (post_attn and mlp_in, each layer), through the same compiled engine,
with transformers beside.

Run by test_vllm_compile_e2e.py in a fresh interpreter of the environment that has vLLM. By hand::

    VLLM_CPU_KVCACHE_SPACE=1 python3 python/tests/vllm_compile_run.py /tmp/model-dir
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List

import torch

import vllm_e2e_concurrent_run as scenario
from vllm_e2e_run import _hook, make_model, packed, vector

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


# The hook points the scenario does not steer (post_attn, mlp_in), one request each per layer.
MORE = [("pa0", "post_attn", 0), ("pa1", "post_attn", 1), ("mi0", "mlp_in", 0), ("mi1", "mlp_in", 1)]


def more_vllm() -> Dict[str, List[int]]:
    """MORE through the compiled engine the scenario built, in one batch."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    prompts = [TokensPrompt(prompt_token_ids=scenario.prompt(name, 9 + i)) for i, (name, _, _) in enumerate(MORE)]
    params = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False,
                             extra_args={"steering_vectors": packed(hook, layer, vector(50 + i))})
              for i, (_, hook, layer) in enumerate(MORE)]
    outs = _seen["llm"].generate(prompts, params, use_tqdm=False)
    return {name: list(o.outputs[0].token_ids) for (name, _, _), o in zip(MORE, outs)}


def more_hf(path: str) -> Dict[str, Dict[str, List[int]]]:
    """MORE in transformers: post_attn is attention's output plus v (its residual add then gives
    the stream plus v), mlp_in the MLP's input plus v."""
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    out: Dict[str, Dict[str, List[int]]] = {"tokens": {}, "unsteered": {}}
    for i, (name, hook, layer) in enumerate(MORE):
        p = scenario.prompt(name, 9 + i)
        out["unsteered"][name] = scenario._greedy(model, p, 8)
        v = vector(50 + i)
        if hook == "post_attn":
            attn = model.model.layers[layer].self_attn
            h = attn.register_forward_hook(lambda _m, _a, o, v=v: (o[0] + v,) + tuple(o[1:]))
        else:
            h = _hook(model, hook, layer, v)
        out["tokens"][name] = scenario._greedy(model, p, 8)
        h.remove()
    return out


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
            "steps": None if st is None else st.steps, "op_calls": _seen["op_calls"],
            "hooks_mode": None if st is None or st.hooks is None else st.hooks.mode,
            "sites_static": bool(sites is not None and sites.static)}


def main() -> None:
    path = sys.argv[1]
    if not os.path.exists(os.path.join(path, "config.json")):
        make_model(path)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the worker here: its runner is read
    _compiled_llm()
    _count_op_calls()
    res: Dict[str, Any] = {"vllm": scenario.run_vllm(path)}
    res["more_vllm"] = more_vllm()
    res["compiled"] = compiled_facts()
    res["hf"] = scenario.run_hf(path)
    res["more_hf"] = more_hf(path)
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
