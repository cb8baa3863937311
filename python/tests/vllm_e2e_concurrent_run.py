"""Concurrent end-to-end run of stock vLLM (CPU build) with the shmsteer plugin: one
``LLMEngine`` step loop over requests with four steering configurations that join and finish at
different steps, plus a conversation whose second turn carries no steering and inherits the
first turn's; transformers with plain hooks beside. Prints one JSON line.

Run by test_vllm_concurrent.py in a fresh interpreter of the environment that has vLLM. By hand::

    VLLM_CPU_KVCACHE_SPACE=1 python3 python/tests/vllm_e2e_concurrent_run.py /tmp/model-dir
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from typing import Any, Dict, List, Optional, Tuple

import torch

from vllm_e2e_run import HIDDEN, _hook, make_model, packed, vector

NAMED, PROBE, CALM = "e2e-named", "e2e-probe", "e2e-calm"
GATE_THRESHOLD, GATE_SHARPNESS, GATE_STRENGTH = 0.0, 50.0, 1.0
# name -> (prompt length, max_tokens, config, step at which it is added)
# configs: "inline" (packed post_block L0, vector(seed)), "named" (mlp_out L1 via a Client),
# "clamp" (projection on a unit direction set to CLAMP_VALUE at post_block L1), "conv" (inline pre_attn L1 with a
# conversation_id), "conv2" (same conversation, no steering), "gate" (a this_token probe gate:
# probe PROBE read at post_block L0, CALM added at post_block L1 on decode rows times the gate),
# None (unsteered).
REQS: List[Tuple[str, int, int, Optional[str], int]] = [
    ("a0", 20, 9, "inline", 0), ("a1", 7, 5, "inline", 0),
    ("n0", 12, 7, "named", 0), ("n1", 5, 10, "named", 0),
    ("c0", 16, 6, "clamp", 0), ("c1", 9, 8, "clamp", 0),
    ("u0", 11, 8, None, 0), ("d0", 13, 6, "conv", 0),
    ("g0", 14, 9, "gate", 0), ("g1", 9, 10, "gate", 2),
    ("a2", 6, 7, "inline", 3), ("n2", 15, 5, "named", 4), ("u1", 8, 9, None, 5), ("c2", 10, 6, "clamp", 6),
]
CONV_NEXT = ("d1", 10, 7)  # added once d0 has finished
CONV_ID = "chat-e2e-1"
CLAMP_VALUE = 8.0  # the clamp sets the stream's projection on direction() to this


def prompt(name: str, n: int) -> List[int]:
    s = sum(map(ord, name))
    return [(7 * s + 3 * j + 5) % 250 + 3 for j in range(n)]


def seed(name: str) -> int:
    return sum(map(ord, name)) % 97


def direction() -> torch.Tensor:
    d = vector(500)
    return d / d.norm()


def probe() -> torch.Tensor:
    d = vector(600)
    return d / d.norm()


def extra(name: str, cfg: Optional[str]) -> Optional[Dict[str, Any]]:
    if cfg == "inline":
        return {"steering_vectors": packed("post_block", 0, vector(seed(name)))}
    if cfg == "named":
        return {"steering_name": NAMED}
    if cfg == "clamp":
        clamp = {"vector": direction().tolist(), "value": CLAMP_VALUE}
        return {"steering_clamps": json.dumps({"post_block": {"1": [clamp]}})}
    if cfg == "conv":
        return {"steering_vectors": packed("pre_attn", 1, vector(900)), "conversation_id": CONV_ID}
    if cfg == "gate":
        return {"steering": json.dumps([{
            "when": {"kind": "probe", "probe": {"kind": "name", "name": PROBE}, "threshold": GATE_THRESHOLD,
                     "sharpness": GATE_SHARPNESS},
            "scope": "this_token",
            "apply": {"kind": "add", "steer": {"kind": "name", "name": CALM}, "strength": GATE_STRENGTH}}])}
    if cfg == "conv2":
        return {"conversation_id": CONV_ID}
    return None


def run_vllm(path: str) -> Dict[str, Any]:
    os.environ.setdefault("SHMSTEER_VLLM", "1")
    ns = os.environ.setdefault("SHMSTEER_NAMESPACE", "e2ec-" + uuid.uuid4().hex[:12])
    secret = os.environ.setdefault("SHMSTEER_SECRET", uuid.uuid4().hex)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if os.environ.get("SHMSTEER_E2E_ENTRY_POINT") != "1":
        import shmsteer.vllm
        shmsteer.vllm.register()
    import shmsteer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    llm = LLM(model=path, skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
              compilation_config={"mode": 0}, max_model_len=128, max_num_seqs=16, max_num_batched_tokens=48,
              enable_prefix_caching=False, seed=0)
    with shmsteer.Client(ns, secret) as c:
        c.register_vector(NAMED, [("mlp_out", 1, 1.0, vector(700).numpy())])
        c.register_vector(PROBE, [("post_block", 0, 1.0, probe().numpy())], kind="probe")
        c.register_vector(CALM, [("post_block", 1, 1.0, vector(800).numpy())])
    eng = llm.llm_engine

    def add(name: str, n: int, mt: int, cfg: Optional[str]) -> None:
        sp = SamplingParams(temperature=0.0, max_tokens=mt, ignore_eos=True, detokenize=False,
                            extra_args=extra(name, cfg))
        eng.add_request(name, TokensPrompt(prompt_token_ids=prompt(name, n)), sp)

    out: Dict[str, List[int]] = {}
    joined: Dict[str, int] = {}
    finished: Dict[str, int] = {}
    step, conv_added = 0, False
    while True:
        for name, n, mt, cfg, at in REQS:
            if at == step:
                add(name, n, mt, cfg)
                joined[name] = step
        if not conv_added and "d0" in out:
            add(CONV_NEXT[0], CONV_NEXT[1], CONV_NEXT[2], "conv2")
            joined[CONV_NEXT[0]], conv_added = step, True
        if step > max(r[4] for r in REQS) and conv_added and not eng.has_unfinished_requests():
            break
        for o in eng.step():
            if o.finished:
                out[o.request_id], finished[o.request_id] = list(o.outputs[0].token_ids), step
        step += 1
        if step > 500:
            raise RuntimeError("the step loop did not finish")
    from shmsteer.vllm.engine import engine_admissions
    adm = engine_admissions()
    return {"tokens": out, "joined": joined, "finished": finished, "steps": step,
            "live_after": None if adm is None else adm.live()}


def _greedy(model: Any, ids: List[int], n: int) -> List[int]:
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(torch.argmax(model(torch.tensor([ids])).logits[0, -1])))
    return ids[-n:]


def _clamp(model: Any, layer: int, d: torch.Tensor) -> Any:
    """A plain hook setting the projection of layer's output on unit d to CLAMP_VALUE."""
    def f(_m: Any, _a: Any, o: Any) -> Any:
        h = o[0] if isinstance(o, tuple) else o
        h = h + (CLAMP_VALUE - h @ d).unsqueeze(-1) * d
        return (h,) + tuple(o[1:]) if isinstance(o, tuple) else h
    return model.model.layers[layer].register_forward_hook(f)


def _gated(model: Any, ids: List[int], n: int) -> Tuple[List[int], List[float]]:
    """Greedy decoding with the gate done by plain hooks as the device path (SteeringHooks,
    torch_hook.py) documents it: on decode forwards only (the first forward is the prefill), the
    last row's gate = sigmoid(sharpness·(h·probe − threshold)), h layer 0's output, and
    gate·GATE_STRENGTH·vector(800) is added to layer 1's output on that row. Only the last row
    matters: layer 1 is the last layer, so the add reaches nothing but that row's logits."""
    gates: List[float] = []
    state = {"decode": False, "gate": 0.0}

    def read(_m: Any, _a: Any, o: Any) -> None:
        h = o[0] if isinstance(o, tuple) else o
        score = h[0, -1] @ probe()
        state["gate"] = float(torch.sigmoid(GATE_SHARPNESS * (score - GATE_THRESHOLD))) if state["decode"] else 0.0

    def add(_m: Any, _a: Any, o: Any) -> Any:
        h = (o[0] if isinstance(o, tuple) else o).clone()
        h[0, -1] += state["gate"] * GATE_STRENGTH * vector(800)
        return (h,) + tuple(o[1:]) if isinstance(o, tuple) else h

    hs = [model.model.layers[0].register_forward_hook(read), model.model.layers[1].register_forward_hook(add)]
    ids = list(ids)
    with torch.no_grad():
        for k in range(n):
            state["decode"] = k > 0
            ids.append(int(torch.argmax(model(torch.tensor([ids])).logits[0, -1])))
            if k > 0:
                gates.append(state["gate"])
    for h in hs:
        h.remove()
    return ids[-n:], gates


def run_hf(path: str) -> Dict[str, Any]:
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    tokens: Dict[str, List[int]] = {}
    unsteered: Dict[str, List[int]] = {}
    gates: Dict[str, List[float]] = {}
    rows = [(r[0], r[1], r[2], r[3]) for r in REQS] + [(CONV_NEXT[0], CONV_NEXT[1], CONV_NEXT[2], "conv2")]
    for name, n, mt, cfg in rows:
        p = prompt(name, n)
        unsteered[name] = _greedy(model, p, mt)
        if cfg == "gate":
            tokens[name], gates[name] = _gated(model, p, mt)
            continue
        if cfg == "inline":
            h = _hook(model, "post_block", 0, vector(seed(name)))
        elif cfg == "named":
            h = _hook(model, "mlp_out", 1, vector(700))
        elif cfg == "clamp":
            h = _clamp(model, 1, direction())
        elif cfg in ("conv", "conv2"):
            h = _hook(model, "pre_attn", 1, vector(900))
        else:
            h = None
        tokens[name] = _greedy(model, p, mt)
        if h is not None:
            h.remove()
    return {"tokens": tokens, "unsteered": unsteered, "configs": {r[0]: r[3] for r in rows},
            "gates": gates}


def main() -> None:
    path = sys.argv[1]
    assert HIDDEN == 256
    if not os.path.exists(os.path.join(path, "config.json")):
        make_model(path)
    res = {"vllm": run_vllm(path)}
    res["hf"] = run_hf(path)
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
