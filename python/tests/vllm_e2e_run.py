"""One end-to-end run of stock vLLM (CPU build) with the shmsteer plugin, as a script: make a
tiny random Llama, generate a batch of steered and unsteered requests with ``LLM``, generate the
same requests with Hugging Face transformers and plain hooks, and print one JSON line with both.

Run by test_vllm_e2e.py in a fresh interpreter of the environment that has vLLM (a vLLM engine
cannot be built twice in one process). With ``SHMSTEER_E2E_ENTRY_POINT=1`` the plugin is left to
vLLM's own load of the ``vllm.general_plugins`` entry point (shmsteer installed in the
environment). By hand::

    VLLM_CPU_KVCACHE_SPACE=1 python3 python/tests/vllm_e2e_run.py /tmp/model-dir
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

import torch

HIDDEN, LAYERS, VOCAB = 256, 2, 256
PROMPTS = [[(7 * i + 3 * j + 5) % 250 + 3 for j in range(n)] for i, n in enumerate((20, 6, 11, 9, 14, 5))]
# (hook, layer, scale) per request; None: unsteered
STEER: List[Optional[Tuple[str, int, float]]] = [
    ("post_block", 0, 1.0), None, ("pre_attn", 1, 1.0), ("mlp_out", 0, 1.0), ("mlp_in", 1, 1.0), None]
MAX_TOKENS = 8


def make_model(path: str) -> None:
    """A random Llama (hidden 256, 2 layers, head size 64), config.json + safetensors."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=512, num_hidden_layers=LAYERS, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=VOCAB, max_position_embeddings=512, rms_norm_eps=1e-5,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)


def vector(i: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(HIDDEN, generator=g)


def packed(hook: str, layer: int, v: torch.Tensor) -> str:
    """The fork's SteeringHookPacked blob, as the JSON text vllm_xargs carries."""
    data = base64.b64encode(v.to(torch.float32).numpy().tobytes()).decode("ascii")
    return json.dumps({hook: {"dtype": "float32", "shape": [1, HIDDEN], "layer_indices": [layer], "data": data}})


def run_vllm(path: str) -> Dict[str, Any]:
    os.environ.setdefault("SHMSTEER_VLLM", "1")
    os.environ.setdefault("SHMSTEER_NAMESPACE", "e2e-" + uuid.uuid4().hex[:12])
    os.environ.setdefault("SHMSTEER_SECRET", uuid.uuid4().hex)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if os.environ.get("SHMSTEER_E2E_ENTRY_POINT") != "1":
        import shmsteer.vllm
        shmsteer.vllm.register()  # what vLLM's load of the entry point does when shmsteer is installed
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    t0 = time.time()
    llm = LLM(model=path, skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
              compilation_config={"mode": 0}, max_model_len=128, max_num_seqs=8, max_num_batched_tokens=32,
              enable_prefix_caching=False, seed=0)
    t_load = time.time() - t0
    params = []
    for i, s in enumerate(STEER):
        extra = None if s is None else {"steering_vectors": packed(s[0], s[1], s[2] * vector(i))}
        params.append(SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0,
                                     detokenize=False, extra_args=extra))
    prompts = [TokensPrompt(prompt_token_ids=p) for p in PROMPTS]
    t0 = time.time()
    outs = llm.generate(prompts, params)
    t_gen = time.time() - t0
    alone = llm.generate([prompts[1]], [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                                                       logprobs=0, detokenize=False)])
    res: Dict[str, Any] = {"tokens": [], "logprobs": [], "load_s": t_load, "generate_s": t_gen}
    for o in outs:
        c = o.outputs[0]
        res["tokens"].append(list(c.token_ids))
        res["logprobs"].append([lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)])
    res["alone"] = list(alone[0].outputs[0].token_ids)
    res.update(refusals(llm, prompts))
    from shmsteer.vllm.engine import engine_admissions
    adm = engine_admissions()
    res["live_after"] = None if adm is None else adm.live()
    import vllm
    runner_kind = "unknown"
    try:
        core = llm.llm_engine.engine_core.engine_core
        runner = core.model_executor.driver_worker.worker.model_runner
        runner_kind = type(runner).__module__ + "." + type(runner).__name__
        res["steps"] = runner.__dict__["_shmsteer"].steps
        res["hooks_mode"] = runner.__dict__["_shmsteer"].hooks.mode
    except AttributeError as e:
        res["steps"] = f"not found: {e}"
    res["runner"], res["vllm"] = runner_kind, vllm.__version__
    return res


def _greedy(model: Any, prompt: List[int]) -> Tuple[List[int], List[float]]:
    ids, lps = list(prompt), []
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            logits = model(torch.tensor([ids])).logits[0, -1]
            t = int(torch.argmax(logits))
            lps.append(float(torch.log_softmax(logits.double(), -1)[t]))
            ids.append(t)
    return ids[len(prompt):], lps


def _hook(model: Any, hook: str, layer: int, v: torch.Tensor) -> Any:
    """A plain hook adding v at the hook point (transformers' layers return the stream)."""
    blk = model.model.layers[layer]

    def add_out(_m: Any, _a: Any, o: Any) -> Any:
        return (o[0] + v,) + tuple(o[1:]) if isinstance(o, tuple) else o + v

    def add_in(_m: Any, a: Any) -> Any:
        return (a[0] + v,) + tuple(a[1:])

    if hook == "post_block":
        return blk.register_forward_hook(add_out)
    if hook == "pre_attn":
        return blk.register_forward_pre_hook(add_in)
    if hook == "mlp_out":
        return blk.mlp.register_forward_hook(add_out)
    if hook == "mlp_in":
        return blk.mlp.register_forward_pre_hook(add_in)
    raise ValueError(hook)


def refusals(llm: Any, prompts: List[Any]) -> Dict[str, Any]:
    """A body the frontend refuses (a vector of the wrong width), one the owner refuses (an
    unknown named vector), and a request after both."""
    from vllm import SamplingParams
    out: Dict[str, Any] = {}

    def sp(extra: Optional[Dict[str, Any]]) -> Any:
        return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False,
                              extra_args=extra)

    bad = base64.b64encode(bytes(4 * 8)).decode("ascii")
    narrow = json.dumps({"post_block": {"dtype": "float32", "shape": [1, 8], "layer_indices": [0], "data": bad}})
    try:
        llm.generate([prompts[0]], [sp({"steering_vectors": narrow})])
        out["refused_frontend"] = None
    except ValueError as e:
        out["refused_frontend"] = f"{type(e).__name__}: {e}"
    try:
        o = llm.generate([prompts[0]], [sp({"steering_name": "no-such-vector"})])
        out["refused_owner"] = {"finish_reason": o[0].outputs[0].finish_reason, "tokens": list(o[0].outputs[0].token_ids)}
    except Exception as e:  # what LLM.generate does with an errored request is vLLM's choice
        out["refused_owner"] = f"{type(e).__name__}: {e}"
    out["after_refusals"] = list(llm.generate([prompts[1]], [sp(None)])[0].outputs[0].token_ids)
    return out


def run_hf(path: str) -> Dict[str, Any]:
    """Greedy decoding with transformers, the vectors added by plain hooks at the same points;
    ``unsteered``: every prompt without hooks."""
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    out: Dict[str, Any] = {"tokens": [], "logprobs": [], "unsteered": []}
    for i, (prompt, s) in enumerate(zip(PROMPTS, STEER)):
        out["unsteered"].append(_greedy(model, prompt)[0])
        h = None if s is None else _hook(model, s[0], s[1], s[2] * vector(i))
        toks, lps = _greedy(model, prompt)
        if h is not None:
            h.remove()
        out["tokens"].append(toks)
        out["logprobs"].append(lps)
    return out


def main() -> None:
    path = sys.argv[1]
    if not os.path.exists(os.path.join(path, "config.json")):
        make_model(path)
    res = {"vllm": run_vllm(path)}
    res["hf"] = run_hf(path)
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
