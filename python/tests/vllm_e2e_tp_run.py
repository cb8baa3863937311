"""One run of stock vLLM (CPU build) with the shmsteer plugin at a tensor-parallel size, as a
script: the tiny random Llama of vllm_e2e_run.py (4 heads: TP 1 or 2), steered and captured
requests (the engine's filesystem consumer), and each rank's view of its steps through
``LLM.collective_rpc``. Prints one JSON line: tokens, logprobs, the capture files (the fork's
reader) and per rank the steps, whether it captures and its last step's checksums.

Run by test_vllm_capture_tp.py twice (TP 1 and TP 2, ``SHMSTEER_E2E_TP``) in fresh interpreters.
By hand (vLLM's CPU backend needs ``nobind`` for TP 2 on a one-NUMA-node machine)::

    VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_CPU_KVCACHE_SPACE=1 python3 python/tests/vllm_e2e_tp_run.py /tmp/model-dir 2
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile
import time
import uuid
from typing import Any, Dict

from vllm_e2e_capture_run import TAG, read_captures
from vllm_e2e_run import MAX_TOKENS, PROMPTS, make_model, packed, vector

# (prompt index, steering (hook, layer) or None, capture hooks or None). The last is scheduled
# last and finishes last: the last step steers rows (its checksums are not those of no work).
CASES = [(0, ("post_block", 0), {"post_block": [0, 1]}), (3, None, {"pre_attn": [1]}), (1, None, None),
         (2, ("mlp_out", 1), None)]


def rank_state(worker: Any) -> Dict[str, Any]:
    """What one worker's plugin did (run on every rank by collective_rpc)."""
    runner = getattr(worker, "model_runner", None) or worker.worker.model_runner
    st = runner.__dict__.get("_shmsteer")
    if st is None:
        return {"steps": 0}
    h = st.hooks
    from shmsteer.vllm.capture import _tp_rank
    return {"rank": _tp_rank(), "runner": type(runner).__module__ + "." + type(runner).__name__, "steps": st.steps, "capturing": st.capturing, "writes": bool(h._capturing),
            "version": st.version, "checksum": h.checksum, "batch_checksum": h.batch_checksum}


def main() -> None:
    path = sys.argv[1]
    tp = int(sys.argv[2]) if len(sys.argv) > 2 else int(os.environ.get("SHMSTEER_E2E_TP", "1"))
    if not os.path.exists(os.path.join(path, "config.json")):
        make_model(path)
    root = tempfile.mkdtemp(prefix="shmsteer-tp-")
    os.environ.setdefault("SHMSTEER_VLLM", "1")
    os.environ.setdefault("SHMSTEER_NAMESPACE", "e2e-tp-" + uuid.uuid4().hex[:12])
    os.environ.setdefault("SHMSTEER_SECRET", uuid.uuid4().hex)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ["SHMSTEER_VLLM_CAPTURE_DIR"] = root
    if os.environ.get("SHMSTEER_E2E_ENTRY_POINT") != "1":
        import shmsteer.vllm
        shmsteer.vllm.register()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    t0 = time.time()
    llm = LLM(model=path, skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
              compilation_config={"mode": 0}, max_model_len=128, max_num_seqs=8, max_num_batched_tokens=32,
              enable_prefix_caching=False, seed=0, tensor_parallel_size=tp,
              distributed_executor_backend="mp" if tp > 1 else None)
    res: Dict[str, Any] = {"tp": tp, "load_s": time.time() - t0}
    params = []
    for i, (p, steer, cap) in enumerate(CASES):
        extra: Dict[str, Any] = {}
        if steer is not None:
            extra["steering_vectors"] = packed(steer[0], steer[1], vector(i))
        if cap is not None:
            extra["capture"] = json.dumps({"fs": {"request_id": f"tp-{i}", "tag": TAG, "hooks": cap, "positions": "all"}})
        params.append(SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0,
                                     detokenize=False, extra_args=extra or None))
    outs = llm.generate([TokensPrompt(prompt_token_ids=PROMPTS[p]) for p, _, _ in CASES], params)
    res["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
    res["logprobs"] = [[lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)] for o in outs]
    res["ranks"] = llm.collective_rpc(rank_state)
    want = sum(1 for c in CASES if c[2] is not None)
    deadline = time.time() + 60
    base = pathlib.Path(root) / TAG
    while time.time() < deadline and sum(1 for d in base.glob("*") if any(d.glob("*.json"))) < want:
        time.sleep(0.2)
    time.sleep(0.5)
    from shmsteer.vllm.capture import stop_consumer
    res["fs_stats"] = stop_consumer()
    res["files"] = read_captures(root)
    print("\nRESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
