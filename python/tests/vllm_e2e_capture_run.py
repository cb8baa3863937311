"""One end-to-end run of activation capture through stock vLLM (CPU build) and the shmsteer
plugin, as a script: the tiny random Llama of vllm_e2e_run.py, the owner in vLLM's engine
declaring the filesystem consumer and running it (``SHMSTEER_VLLM_CAPTURE_DIR``), a batch of
captured, steered and plain requests (chunked prefill), the capture files read with the fork's
reader (capture/testdata/fork_reader.py), and the same requests in Hugging Face transformers with
plain hooks recording the hidden states at the same points. Prints one JSON line.

Run by test_vllm_capture.py in a fresh interpreter of the environment that has vLLM. By hand::

    VLLM_CPU_KVCACHE_SPACE=1 python3 python/tests/vllm_e2e_capture_run.py /tmp/model-dir
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

import torch

from vllm_e2e_run import LAYERS, MAX_TOKENS, PROMPTS, make_model, packed, vector

FORK_READER = pathlib.Path(__file__).resolve().parents[2] / "capture" / "testdata" / "fork_reader.py"
TAG = "e2e"

# (prompt index, capture spec or None, steering (hook, layer) or None). The specs' request_id
# names the directory ({root}/e2e/{request_id}); positions: what the fork's selectors select.
CASES: List[Tuple[int, Optional[Dict[str, Any]], Optional[Tuple[str, int]]]] = [
    (0, {"hooks": {"post_block": [0, 1], "pre_attn": [1]}, "positions": "all"}, None),
    (2, {"hooks": {"mlp_in": [0], "post_attn": [1], "mlp_out": [1]}, "positions": [0, 2, 5], "layout": "packed"}, None),
    (3, {"hooks": {"post_block": [0], "pre_attn": [1]}, "positions": "all"}, ("post_block", 0)),
    (4, {"hooks": {"post_block": "all"}, "positions": "last_prompt"}, ("mlp_out", 1)),
    (5, {"hooks": {"post_block": [1]}, "positions": "all_generated"}, None),
    (1, None, None),                       # neither: no files
    (0, None, ("post_block", 0)),          # steered only: no files
]


def rid(i: int) -> str:
    return f"cap-{i}"


def positions(sel: Any, prompt: int) -> List[int]:
    """The positions vLLM computes for a request that sel selects: the prompt's, then one per
    decode step but the last token's (sampled, never fed back)."""
    total = prompt + MAX_TOKENS - 1
    if sel == "all":
        return list(range(total))
    if sel == "all_prompt":
        return list(range(prompt))
    if sel == "last_prompt":
        return [prompt - 1]
    if sel == "all_generated":
        return list(range(prompt, total))
    return sorted(sel)


def sites(hooks: Dict[str, Any]) -> List[Tuple[int, str]]:
    out = []
    for hook, sel in hooks.items():
        for layer in (range(LAYERS) if sel == "all" else sel):
            out.append((int(layer), hook))
    return sorted(out)


def run_vllm(path: str, root: str) -> Dict[str, Any]:
    os.environ.setdefault("SHMSTEER_VLLM", "1")
    os.environ.setdefault("SHMSTEER_NAMESPACE", "e2e-cap-" + uuid.uuid4().hex[:12])
    os.environ.setdefault("SHMSTEER_SECRET", uuid.uuid4().hex)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ["SHMSTEER_VLLM_CAPTURE_DIR"] = root
    if os.environ.get("SHMSTEER_E2E_ENTRY_POINT") != "1":
        import shmsteer.vllm
        shmsteer.vllm.register()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    llm = LLM(model=path, skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
              compilation_config={"mode": 0}, max_model_len=128, max_num_seqs=8, max_num_batched_tokens=32,
              enable_prefix_caching=False, seed=0)

    def sp(extra: Optional[Dict[str, Any]]) -> Any:
        return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False,
                              extra_args=extra)

    params = []
    for i, (p, cap, steer) in enumerate(CASES):
        extra: Dict[str, Any] = {}
        if cap is not None:  # the JSON text vllm_xargs carries
            extra["capture"] = json.dumps({"fs": dict(cap, request_id=rid(i), tag=TAG)})
        if steer is not None:
            extra["steering_vectors"] = packed(steer[0], steer[1], vector(i))
        params.append(sp(extra or None))
    t0 = time.time()
    outs = llm.generate([TokensPrompt(prompt_token_ids=PROMPTS[p]) for p, _, _ in CASES], params)
    res: Dict[str, Any] = {"tokens": [list(o.outputs[0].token_ids) for o in outs], "generate_s": time.time() - t0}
    # A request naming a consumer the owner does not declare fails alone.
    bad = json.dumps({"nope": {"request_id": "nope", "tag": TAG, "hooks": {"post_block": [0]}, "positions": "all"}})
    o = llm.generate([TokensPrompt(prompt_token_ids=PROMPTS[1])], [sp({"capture": bad})])
    res["undeclared"] = o[0].outputs[0].finish_reason
    res["after"] = list(llm.generate([TokensPrompt(prompt_token_ids=PROMPTS[1])], [sp(None)])[0].outputs[0].token_ids)
    # The consumer publishes after each request's end: wait for every captured request's files.
    want = {rid(i) for i, (_, cap, _) in enumerate(CASES) if cap is not None}
    deadline = time.time() + 60
    while time.time() < deadline:
        done = {d.name for d in (pathlib.Path(root) / TAG).glob("*") if any(d.glob("*.json"))} if (
            pathlib.Path(root) / TAG).is_dir() else set()
        if done >= want:
            break
        time.sleep(0.2)
    time.sleep(0.5)  # a request's last files are renamed in place one by one
    from shmsteer.vllm.capture import stop_consumer
    from shmsteer.vllm.engine import engine_admissions
    res["fs_stats"] = stop_consumer()
    adm = engine_admissions()
    res["live_after"] = None if adm is None else adm.live()
    try:
        runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
        res["capturing"] = runner.__dict__["_shmsteer"].capturing
        res["hooks_mode"] = runner.__dict__["_shmsteer"].hooks.mode
    except (AttributeError, KeyError) as e:
        res["capturing"] = f"not found: {e}"
    return res


def read_captures(root: str) -> Dict[str, Any]:
    """{request dir: {"layer_hook": {dtype, positions, data}}} as the fork's reader reads them."""
    spec = importlib.util.spec_from_file_location("fork_reader", FORK_READER)
    assert spec is not None and spec.loader is not None
    reader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reader)
    out: Dict[str, Any] = {}
    base = pathlib.Path(root)
    for d in sorted(p for p in base.rglob("*") if p.is_dir() and any(p.glob("*.json"))):
        got = reader.read_request(d)
        out[str(d.relative_to(base))] = {f"{layer}_{hook}": {"dtype": dt, "positions": list(pos), "data": arr.tolist()}
                                         for (layer, hook), (arr, dt, pos) in got.items()}
    return out


def run_hf(path: str, tokens: List[List[int]]) -> Dict[str, Any]:
    """Per captured request, transformers' hidden states at each captured site and position:
    one forward over the prompt and the tokens vLLM generated (but the last), hooks recording
    each site's value before a plain hook adds the request's vector (if steered) at its point."""
    from transformers import LlamaForCausalLM

    from vllm_e2e_run import _greedy, _hook
    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    out: Dict[str, Any] = {}
    for i, (p, cap, steer) in enumerate(CASES):
        if cap is None:
            continue
        prompt = PROMPTS[p]
        rec: Dict[str, torch.Tensor] = {}
        handles = [record(model, layer, hook, rec) for layer, hook in sites(cap["hooks"])]
        if steer is not None:  # after the recorders: they see the value before the add
            handles.append(_hook(model, steer[0], steer[1], vector(i)))
        ids = list(prompt) + tokens[i][:-1]
        with torch.no_grad():
            model(torch.tensor([ids]))
        for h in handles:
            h.remove()
        pos = positions(cap["positions"], len(prompt))
        hf_tokens = None
        if steer is not None:
            h = _hook(model, steer[0], steer[1], vector(i))
            hf_tokens = _greedy(model, prompt)[0]
            h.remove()
        else:
            hf_tokens = _greedy(model, prompt)[0]
        out[rid(i)] = {"sites": {k: v[pos].tolist() for k, v in rec.items()}, "positions": pos, "tokens": hf_tokens}
    return out


def record(model: Any, layer: int, hook: str, rec: Dict[str, torch.Tensor]) -> Any:
    """A hook storing the stream (or MLP tensor) at (layer, hook) into rec, in vLLM's terms:
    pre_attn the layer's input, post_attn the input of post_attention_layernorm (the stream with
    attention added), mlp_in / mlp_out the MLP's input / output, post_block the layer's output."""
    blk = model.model.layers[layer]
    key = f"{layer}_{hook}"

    def pre(_m: Any, a: Any) -> None:
        rec[key] = a[0][0].detach().clone()

    def post(_m: Any, _a: Any, o: Any) -> None:
        rec[key] = (o[0] if isinstance(o, tuple) else o)[0].detach().clone()

    if hook == "pre_attn":
        return blk.register_forward_pre_hook(pre)
    if hook == "post_attn":
        return blk.post_attention_layernorm.register_forward_pre_hook(pre)
    if hook == "mlp_in":
        return blk.mlp.register_forward_pre_hook(pre)
    if hook == "mlp_out":
        return blk.mlp.register_forward_hook(post)
    if hook == "post_block":
        return blk.register_forward_hook(post)
    raise ValueError(hook)


def main() -> None:
    path = sys.argv[1]
    if not os.path.exists(os.path.join(path, "config.json")):
        make_model(path)
    root = tempfile.mkdtemp(prefix="shmsteer-capture-")
    res: Dict[str, Any] = {"vllm": run_vllm(path, root)}
    res["files"] = read_captures(root)
    res["hf"] = run_hf(path, res["vllm"]["tokens"])
    print("\nRESULT " + json.dumps(res), flush=True)  # on a line of its own, whatever was written before


if __name__ == "__main__":
    main()
