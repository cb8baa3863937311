"""Issue 40's figure: time per output token of stock vLLM (CPU build) steered by the shmsteer
plugin, against the same run unsteered, side by side in one process.

Model: a random Llama made on the spot (``--hidden`` 1024, ``--layers`` 2, 16 heads of 64, vocab
512, float32), served by ``vllm.LLM`` eagerly on vLLM's CPU backend with the plugin installed.
Workload: 32 requests (prompts of 8 to 23 tokens, ``--max-tokens`` new tokens each, greedy,
``ignore_eos``) in 16 distinct steering configurations, two requests each: packed inline vectors
at each of the five hook points and at both layers, a two-layer packed blob, prefill-only and
decode-only vectors, two named vectors registered through a ``shmsteer.Client``, a projection
clamp, a clamp plus a vector, a ``this_token`` probe gate, a vector with a conversation id.

With ``--compile`` the model runs under vLLM's torch.compile (``compilation_config={"mode": 3}``,
on the CPU ``DYNAMO_TRACE_ONCE`` with inductor) and the plugin's compiled sites; only ``steered``
and ``unsteered`` run (the sites are in the graph: they cannot be switched off in the process).

Contenders, alternated round by round (the order rotates each round), each one
``llm.generate`` of the 32 requests:

* ``steered``: the requests with their steering fields;
* ``unsteered``: the same requests without steering fields, the plugin on (hooks attached, a
  resolve per step, every site's hook runs and finds nothing to steer);
* ``off``: the plugin off in the same process: the runner's ``_model_forward`` put back to vLLM's
  own and the layer hooks removed (they are put back for the next plugin-on round). This needs the
  worker in the benchmark's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), which is what
  ``LLM`` uses here.

Time per output token as vLLM's serving benchmark defines it (``tpot``): each request's time
from its first token to its last over its tokens after the first, from the engine's own
timestamps (``RequestOutput.metrics``, with ``disable_log_stats=False``), averaged over the
requests of a generate; it leaves out the time to the first token (``ttft``, reported beside
it: the admission, the queue and the prefill). Then the end-to-end time per output token = the
contender's wall time / the output tokens (``wall``: the admissions and the prefill steps
included); beside it the process's CPU time per output token (every thread of this process: the
engine and the worker run here), which other processes' load on a shared machine disturbs less,
and the main thread's CPU time per output token (the engine loop, the plugin's work and the
forward's share of torch's threads). Reported for each clock: per contender the median over
rounds; ``steered`` / ``unsteered``, ``steered`` / ``off`` and ``unsteered`` / ``off`` as the
median of the per-round ratios and as the ratio of the medians, with min and max of the
per-round ratios. With ``--profile``, one extra steered generate and one unsteered are timed by
parts (the per-step span resolve and step end, the spans, the hooks' applies, the folds;
compiled, the operator's kernel) from the plugin's own functions, wrapped with timers.

    SHMSTEER_LIB=... PYTHONPATH=python ~/.cache/shmsteer/vllm-venv/bin/python \\
        python/benchmarks/vllm_step.py [--rounds 15] [--max-tokens 16] [--json out.json] [--profile] [--compile]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any, Callable, Dict, List, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

VOCAB, HEADS = 512, 16
NAMED_A, NAMED_B, PROBE, CALM = "fig-named-a", "fig-named-b", "fig-probe", "fig-calm"


def make_model(path: str, hidden: int, layers: int) -> None:
    """A random Llama: hidden x layers, 16 heads (head size hidden/16), config.json + safetensors."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=HEADS, num_key_value_heads=HEADS, vocab_size=VOCAB,
                      max_position_embeddings=1024, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)


def vector(i: int, hidden: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + i)
    return scale * torch.randn(hidden, generator=g)


def unit(i: int, hidden: int) -> torch.Tensor:
    v = vector(i, hidden)
    return v / v.norm()


def packed(hook: str, rows: List[Tuple[int, torch.Tensor]]) -> Dict[str, Any]:
    data = torch.stack([v for _, v in rows]).to(torch.float32).numpy().tobytes()
    return {hook: {"dtype": "float32", "shape": [len(rows), int(rows[0][1].shape[0])],
                   "layer_indices": [layer for layer, _ in rows], "data": base64.b64encode(data).decode("ascii")}}


def configs(hidden: int, layers: int) -> List[Dict[str, Any]]:
    """The 16 steering configurations (extra_args, JSON text as vllm_xargs carries it)."""
    last = layers - 1

    def sv(hook: str, layer: int, seed: int) -> Dict[str, Any]:
        return {"steering_vectors": json.dumps(packed(hook, [(layer, vector(seed, hidden, 0.5))]))}

    clamp = {"post_block": {str(last): [{"vector": unit(50, hidden).tolist(), "value": 4.0}]}}
    gate = [{"when": {"kind": "probe", "probe": {"kind": "name", "name": PROBE}, "threshold": 0.0, "sharpness": 10.0},
             "scope": "this_token", "apply": {"kind": "add", "steer": {"kind": "name", "name": CALM}, "strength": 1.0}}]
    out = [sv("pre_attn", 0, 1), sv("post_attn", 0, 2), sv("mlp_in", 0, 3), sv("mlp_out", 0, 4), sv("post_block", 0, 5),
           sv("pre_attn", last, 6), sv("mlp_out", last, 7), sv("post_block", last, 8),
           {"steering_vectors": json.dumps(packed("post_block", [(i, vector(20 + i, hidden, 0.3))
                                                                 for i in range(layers)]))},
           {"prefill_steering_vectors": json.dumps(packed("post_block", [(0, vector(30, hidden, 0.5))]))},
           {"decode_steering_vectors": json.dumps(packed("mlp_out", [(last, vector(31, hidden, 0.5))]))},
           {"steering_name": NAMED_A},
           {"steering_name": NAMED_B},
           {"steering_clamps": json.dumps(clamp)},
           {"steering": json.dumps(gate)},
           dict(sv("post_attn", last, 9), conversation_id="fig-conv")]
    assert len(out) == 16 and len({json.dumps(c, sort_keys=True) for c in out}) == 16
    return out


def prompts(n: int) -> List[List[int]]:
    return [[(7 * i + 3 * j + 5) % (VOCAB - 6) + 3 for j in range(8 + i % 16)] for i in range(n)]


class Toggle:
    """The plugin off and on again in this process (the worker runs here)."""

    def __init__(self, llm: Any) -> None:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        core = llm.llm_engine.engine_core.engine_core
        self.runner = core.model_executor.driver_worker.worker.model_runner
        self.cls = GPUModelRunner
        self.patched = GPUModelRunner._model_forward
        names = list(self.patched.__code__.co_freevars)
        assert "orig" in names, f"the plugin's _model_forward wrapper closes over {names}"
        self.orig = self.patched.__closure__[names.index("orig")].cell_contents

    def off(self) -> None:
        st = self.runner.__dict__["_shmsteer"]
        st.sites.remove()
        self.cls._model_forward = self.orig

    def on(self) -> None:
        from shmsteer.vllm.layers import LayerSites
        from shmsteer.vllm.worker import _hooks_setting
        st = self.runner.__dict__["_shmsteer"]
        if not st.sites.sites:
            client = st.hooks._handle
            st.sites = LayerSites(st.model, st.hooks.apply, client.hook_id, _hooks_setting(client.model[2]))
        self.cls._model_forward = self.patched


def profile(llm: Any, run: Callable[[], int]) -> Dict[str, float]:
    """One generate with the plugin's parts timed (ms per step): the step's resolve and end, the
    spans, the applies, the folds (eager: compiled, they are in the graph) and, compiled, the
    operator's whole kernel (``site``, the applies included)."""
    from shmsteer.vllm import layers, worker
    runner = Toggle(llm).runner
    st = runner.__dict__["_shmsteer"]
    hooks = st.hooks
    acc = {"resolve": 0.0, "end": 0.0, "spans": 0.0, "apply": 0.0, "fold": 0.0, "site": 0.0}
    cls = type(hooks)
    orig_step, orig_fold, orig_spans, orig_run = cls.step, layers._fold, worker.spans_from_v1, layers.LayerSites.run
    orig_apply = hooks.apply
    client = hooks._handle
    want = worker._hooks_setting(client.model[2])

    def timed(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def f(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[key] += time.perf_counter() - t0
        return f

    import contextlib

    @contextlib.contextmanager
    def step(self: Any, *a: Any, **k: Any) -> Any:
        cm = orig_step(self, *a, **k)
        t0 = time.perf_counter()
        cm.__enter__()
        acc["resolve"] += time.perf_counter() - t0
        try:
            yield self
        finally:
            t0 = time.perf_counter()
            cm.__exit__(None, None, None)
            acc["end"] += time.perf_counter() - t0

    try:
        cls.step = step
        layers._fold = timed("fold", orig_fold)
        worker.spans_from_v1 = timed("spans", orig_spans)
        layers.LayerSites.run = timed("site", orig_run)  # type: ignore[method-assign]  # the operator's kernel calls it
        st.sites.bind(timed("apply", orig_apply), client.hook_id, want)
        steps0 = st.steps
        t0 = time.perf_counter()
        tokens = run()
        total = time.perf_counter() - t0
    finally:
        cls.step, layers._fold, worker.spans_from_v1 = orig_step, orig_fold, orig_spans
        layers.LayerSites.run = orig_run  # type: ignore[method-assign]
        st.sites.bind(orig_apply, client.hook_id, want)
    steps = st.steps - steps0
    assert acc["apply"] > 0, "the profiled run went through the timed apply"
    out = {k: v / steps * 1e3 for k, v in acc.items()}
    parts = ("resolve", "end", "spans", "site", "fold") if st.compiled else ("resolve", "end", "spans", "apply", "fold")
    out["plugin"] = sum(out[k] for k in parts)
    out["plugin_share"] = out["plugin"] / (total / steps * 1e3)
    out.update(step_ms=total / steps * 1e3, steps=steps, tokens=tokens, sites=len(st.sites.sites))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--model", default="", help="model directory (made there when it has no config.json)")
    ap.add_argument("--no-off", action="store_true", help="leave out the plugin-off contender")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--compile", action="store_true",
                    help="vLLM's torch.compile (mode 3; DYNAMO_TRACE_ONCE + inductor on the CPU): the plugin's "
                         "compiled sites; no off contender (the sites are in the graph)")
    ap.add_argument("--json", default="", help="write the results there")
    a = ap.parse_args()
    if a.compile:
        a.no_off = True
    if a.hidden < 1024 or a.hidden % HEADS or a.hidden // HEADS < 32:
        ap.error("the figure's model has hidden >= 1024 and a head size >= 32 (hidden / 16)")

    path = a.model or os.path.join(tempfile.mkdtemp(prefix="vllm-fig-"), "model")
    if not os.path.exists(os.path.join(path, "config.json")):
        make_model(path, a.hidden, a.layers)
    os.environ["SHMSTEER_VLLM"] = "1"
    ns = os.environ.setdefault("SHMSTEER_NAMESPACE", "fig-" + uuid.uuid4().hex[:12])
    secret = os.environ.setdefault("SHMSTEER_SECRET", uuid.uuid4().hex)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the worker in this process: "off" can toggle it
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import shmsteer
    import shmsteer.vllm
    shmsteer.vllm.register()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=path, skip_tokenizer_init=True, dtype="float32", enforce_eager=not a.compile,
              compilation_config={"mode": 3 if a.compile else 0}, max_model_len=256, max_num_seqs=32,
              max_num_batched_tokens=1024, disable_log_stats=False,  # RequestOutput.metrics: tpot, ttft
              enable_prefix_caching=False, seed=0)
    with shmsteer.Client(ns, secret) as c:
        c.register_vector(NAMED_A, [("post_block", 0, 1.0, vector(40, a.hidden, 0.5).numpy())])
        c.register_vector(NAMED_B, [("mlp_out", i, 1.0, vector(41 + i, a.hidden, 0.3).numpy())
                                    for i in range(a.layers)])
        c.register_vector(PROBE, [("post_block", 0, 1.0, unit(60, a.hidden).numpy())], kind="probe")
        c.register_vector(CALM, [("post_block", a.layers - 1, 1.0, vector(61, a.hidden, 0.5).numpy())])

    cfgs = configs(a.hidden, a.layers)
    ps = [TokensPrompt(prompt_token_ids=p) for p in prompts(32)]

    def params(steer: bool) -> List[Any]:
        return [SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True, detokenize=False,
                               extra_args=cfgs[i % 16] if steer else None) for i in range(32)]

    steered_p, plain_p = params(True), params(False)
    outs: Dict[str, List[List[int]]] = {}
    last: Dict[str, float] = {}

    def gen(sp: List[Any], key: str) -> int:
        res = llm.generate(ps, sp, use_tqdm=False)
        outs[key] = [list(o.outputs[0].token_ids) for o in res]
        last["tpot"], last["ttft"] = token_times(res)
        return sum(len(t) for t in outs[key])

    gen(steered_p, "steered")  # warm: the worker attaches, the tables fill
    gen(plain_p, "unsteered")
    toggle = None if a.no_off else Toggle(llm)
    names = ["steered", "unsteered"] + ([] if a.no_off else ["off"])
    clocks = time_rounds(names, a.rounds, toggle, lambda n: gen(steered_p if n == "steered" else plain_p, n), last)

    res: Dict[str, Any] = {
        "model": {"hidden": a.hidden, "layers": a.layers, "heads": HEADS, "vocab": VOCAB, "dtype": "float32"},
        "requests": 32, "configs": 16, "max_tokens": a.max_tokens, "rounds": a.rounds, "compiled": a.compile,
        "unsteered_equals_off": outs["unsteered"] == outs["off"] if "off" in outs else None,
        "steered_changes_tokens": outs["steered"] != outs["unsteered"],
        "torch_threads": torch.get_num_threads(),
        **{clock: summary(times) for clock, times in clocks.items()},
    }
    if a.profile:
        res["profile_ms_per_step"] = profile(llm, lambda: gen(steered_p, "profiled"))
        assert outs["profiled"] == outs["steered"], "the profiled run steered as the timed ones"
        res["profile_unsteered_ms_per_step"] = profile(llm, lambda: gen(plain_p, "profiled"))
    print(table(res))
    print("RESULT " + json.dumps(res), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


def time_rounds(names: List[str], rounds: int, toggle: Any, gen: Callable[[str], int],
                last: Dict[str, float]) -> Dict[str, Dict[str, List[float]]]:
    """The contenders' generates, alternated round by round (the order rotating): per clock
    (tpot, ttft, wall, cpu, thread), per contender, one figure a round. ``gen(name)`` runs one
    generate and returns its tokens, leaving its tpot and ttft in ``last``."""
    clocks: Dict[str, Dict[str, List[float]]] = {c: {n: [] for n in names}
                                                 for c in ("tpot", "ttft", "wall", "cpu", "thread")}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            if n == "off" and toggle is not None:
                toggle.off()
            t0, c0, h0 = time.perf_counter(), time.process_time(), time.thread_time()
            toks = gen(n)
            dt, dc, dh = time.perf_counter() - t0, time.process_time() - c0, time.thread_time() - h0
            if n == "off" and toggle is not None:
                toggle.on()
            for clock, v in (("tpot", last["tpot"]), ("ttft", last["ttft"]), ("wall", dt / toks * 1e3),
                             ("cpu", dc / toks * 1e3), ("thread", dh / toks * 1e3)):
                clocks[clock][n].append(v)
    return clocks


def token_times(res: List[Any]) -> Tuple[float, float]:
    """(tpot, ttft) of one generate in ms, means over its requests: a request's time per output
    token after the first ((last token - first token) / (tokens - 1), the engine core's
    timestamps) and its time to the first token (from its arrival)."""
    tp, tf = [], []
    for o in res:
        m, n = o.metrics, len(o.outputs[0].token_ids)
        if m is None or not m.first_token_ts or n < 2:
            raise RuntimeError("no token timestamps in RequestOutput.metrics (disable_log_stats=False, "
                               "--max-tokens >= 2)")
        tp.append((m.last_token_ts - m.first_token_ts) / (n - 1) * 1e3)
        tf.append(m.first_token_latency * 1e3)
    return statistics.fmean(tp), statistics.fmean(tf)


def summary(times: Dict[str, List[float]]) -> Dict[str, Any]:
    """Per contender the ms per token over rounds, and the ratios of the pairs."""
    def ratio(x: str, y: str) -> Dict[str, float]:
        per = [p / q for p, q in zip(times[x], times[y])]
        return {"median_of_ratios": statistics.median(per), "ratio_of_medians":
                statistics.median(times[x]) / statistics.median(times[y]), "min": min(per), "max": max(per)}

    out: Dict[str, Any] = {"ms_per_token": {n: {"median": statistics.median(v), "min": min(v), "max": max(v), "all": v}
                                            for n, v in times.items()}}
    for x, y in (("steered", "unsteered"), ("steered", "off"), ("unsteered", "off")):
        if x in times and y in times:
            out[f"{x}_vs_{y}"] = ratio(x, y)
    return out


def table(res: Dict[str, Any]) -> str:
    lines = [f"hidden {res['model']['hidden']} x {res['model']['layers']} layers, {res['requests']} requests, "
             f"{res['configs']} configs, {res['max_tokens']} tokens each, {res['rounds']} rounds, "
             f"{'torch.compile' if res['compiled'] else 'eager'}"]
    for clock in ("tpot", "ttft", "wall", "cpu", "thread"):
        unit = "median ms" if clock == "ttft" else "median ms/token"
        lines.append(f"{clock + ' contender':<16} {unit:>16} {'min':>8} {'max':>8}")
        for n, v in res[clock]["ms_per_token"].items():
            lines.append(f"{'  ' + n:<16} {v['median']:>16.3f} {v['min']:>8.3f} {v['max']:>8.3f}")
        for k in ("steered_vs_unsteered", "steered_vs_off", "unsteered_vs_off"):
            if k in res[clock]:
                r = res[clock][k]
                lines.append(f"  {k:<20} median of ratios {r['median_of_ratios']:.3f}  ratio of medians "
                             f"{r['ratio_of_medians']:.3f}  [{r['min']:.3f}, {r['max']:.3f}]")
    for key in ("profile_ms_per_step", "profile_unsteered_ms_per_step"):
        if key in res:
            lines.append(f"{key}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                for k, v in res[key].items()))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
