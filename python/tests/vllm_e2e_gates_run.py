"""Declarative gates through stock vLLM (CPU build) with the shmsteer plugin, every scope and
both apply kinds in one ``LLM.generate`` batch, against transformers with the gate computed by
hand. Prints one JSON line.

The requests (``REQS``): a probe reads ``post_block`` of layer 0 (named probe ``PROBE``); an add
puts ``CALM`` (a named vector) on ``post_block`` of layer 1; an attenuation damps the request's
own inline vector at ``post_block`` of layer 0. Scopes this_token (probe and always), next_step,
rest_of_request, rest_of_conversation (a first turn whose gate engages, then a second turn that
carries only the conversation id: it must start engaged), and attenuate with next_step,
rest_of_request and this_token/always. Each probe gate's threshold is chosen from transformers'
own scores of the request's prompt (``pick``) so that the gate holds at some decode steps and
fires at others, with a margin, and so that the gate changes the request's tokens: the test
can fail.

The reference (``ref_run``) decodes greedily with transformers' KV cache, one forward per vLLM
step of the request (the prompt, then one row per decode step), and applies the engine's rules
(steer/gates_step.go) by hand: only decode rows are gated; the probe score is h·probe of layer
0's output before that site's steering; this_token adds g·strength·CALM on the same row, g =
sigmoid(sharpness·(score − threshold)); the host scopes fire on g > 0.5 and apply from the
request's next decode step (next_step: that step only; rest_of_*: until the end); an engaged
attenuate multiplies the request's own steering by max(0, strength) on decode rows.

Run by test_vllm_gates.py in a fresh interpreter of the environment that has vLLM. By hand::

    VLLM_CPU_KVCACHE_SPACE=1 python3 python/tests/vllm_e2e_gates_run.py /tmp/model-dir [compile]

With ``compile`` vLLM compiles the model (``compilation_config={"mode": 3}``, which the CPU
backend runs as ``DYNAMO_TRACE_ONCE`` with inductor): the gates run through the plugin's
compiled sites, one operator call per site in the graph.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import uuid
from typing import Any, Dict, List, Optional, Tuple

import torch

from vllm_e2e_run import HIDDEN, make_model, packed, vector

PROBE, PROBE_NEG, CALM = "gates-probe", "gates-probe-neg", "gates-calm"
SHARPNESS, STRENGTH, OWN_SCALE = 400.0, 1.0, 1.0
MARGIN = 2e-3  # every probe score the decisions depend on is this far from its threshold
CONV_ID = "chat-gates-1"
# name -> (prompt length, max_tokens, own inline vector at post_block L0?, gate (scope, when,
# apply, strength) or None, conversation turn (1, 2) or 0)
REQS: Dict[str, Tuple[int, int, bool, Optional[Tuple[str, str, str, float]], int]] = {
    "tt": (14, 10, False, ("this_token", "probe", "add", STRENGTH), 0),
    "ta": (9, 8, False, ("this_token", "always", "add", STRENGTH), 0),
    "ns": (12, 10, False, ("next_step", "probe", "add", STRENGTH), 0),
    "nw": (7, 9, False, ("next_step", "always", "add", STRENGTH), 0),
    "rr": (16, 10, False, ("rest_of_request", "probe", "add", STRENGTH), 0),
    "rc": (11, 10, False, ("rest_of_conversation", "probe", "add", STRENGTH), 1),
    "an": (10, 10, True, ("next_step", "probe", "attenuate", 0.0), 0),
    "ar": (13, 10, True, ("rest_of_request", "probe", "attenuate", 0.25), 0),
    "aa": (8, 8, True, ("this_token", "always", "attenuate", 0.0), 0),
    "o0": (15, 8, True, None, 0),
    "u0": (6, 8, False, None, 0),
}
TURN2 = ("rc2", 9, 10)  # the conversation's second turn: only conversation_id, after rc finished
REFUSED = ("this_token", "probe", "attenuate", 0.5)  # ErrGateUnsupported


def prompt(name: str, n: int, salt: int) -> List[int]:
    s = sum(map(ord, name)) + 31 * salt
    return [(7 * s + 3 * j * (salt + 1) + 5) % 250 + 3 for j in range(n)]


def own(name: str) -> torch.Tensor:
    return OWN_SCALE * vector(sum(map(ord, name)) % 97)


def probe(sign: int = 1) -> torch.Tensor:
    """The unit probe direction (PROBE), or its opposite (PROBE_NEG, sign -1): a request whose
    scores fall as it decodes gets the one whose scores rise."""
    d = vector(600)
    return sign * d / d.norm()


def calm() -> torch.Tensor:
    return vector(800)


def gate_json(g: Tuple[str, str, str, float], thr: float, sign: int = 1) -> str:
    scope, when, apply, strength = g
    w: Dict[str, Any] = {"kind": "always"}
    if when == "probe":
        name = PROBE if sign > 0 else PROBE_NEG
        w = {"kind": "probe", "probe": {"kind": "name", "name": name}, "threshold": thr, "sharpness": SHARPNESS}
    a: Dict[str, Any] = {"kind": apply, "strength": strength}
    if apply == "add":
        a["steer"] = {"kind": "name", "name": CALM}
    return json.dumps([{"when": w, "scope": scope, "apply": a}])


def _out(o: Any) -> torch.Tensor:
    return o[0] if isinstance(o, tuple) else o


def _put(o: Any, h: torch.Tensor) -> Any:
    return (h,) + tuple(o[1:]) if isinstance(o, tuple) else h


def ref_run(model: Any, ids: List[int], n: int, own_v: Optional[torch.Tensor],
            gate: Optional[Tuple[str, str, str, float]], thr: float, inert: bool = False,
            engaged: bool = False, sign: int = 1) -> Dict[str, Any]:
    """Greedy decoding of n tokens with the gate done by hand (the module doc). ``inert``: the
    gate scores but never acts (the request's trajectory without it); ``engaged``: a rest_of_
    scope starts engaged (a conversation's later turn)."""
    scope, when, apply, strength = gate if gate is not None else ("", "", "", 0.0)
    pv = probe(sign).double()
    st: Dict[str, Any] = {"decode": False, "pulse": False, "sticky": engaged, "score": None, "g": 0.0, "f": 1.0}
    rec: Dict[str, List[Any]] = {"scores": [], "fired": [], "engaged": [], "g": []}

    def l0(_m: Any, _a: Any, o: Any) -> Any:
        h = _out(o)
        if st["decode"] and gate is not None and when == "probe":
            st["score"] = float(h[0, -1].double() @ pv)
            st["g"] = 1 / (1 + math.exp(-SHARPNESS * (st["score"] - thr)))
        if own_v is not None:
            h = h + st["f"] * own_v
        return _put(o, h)

    def l1(_m: Any, _a: Any, o: Any) -> Any:
        h = _out(o)
        if not st["decode"] or gate is None or apply != "add" or inert:
            return o
        w = st["g"] if (scope == "this_token" and when == "probe") else (1.0 if st["on"] else 0.0)
        h = h.clone()
        h[0, -1] += st["f"] * strength * w * calm()
        return _put(o, h)

    hs = [model.model.layers[0].register_forward_hook(l0), model.model.layers[1].register_forward_hook(l1)]
    toks: List[int] = []
    lps: List[float] = []
    cache, x = None, list(ids)
    try:
        with torch.no_grad():
            for k in range(n):
                st["decode"] = k > 0
                on = st["decode"] and not inert and gate is not None and (
                    (scope == "this_token" and when == "always") or (scope == "next_step" and st["pulse"])
                    or (scope.startswith("rest_of_") and st["sticky"]))
                st["on"] = on
                st["f"] = max(0.0, strength) if on and apply == "attenuate" else 1.0
                out = model(input_ids=torch.tensor([x]), past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                logits = out.logits[0, -1]
                t = int(torch.argmax(logits))
                toks.append(t)
                lps.append(float(torch.log_softmax(logits.double(), -1)[t]))
                x = [t]
                if not st["decode"] or gate is None:
                    continue
                fired = when == "always" or st["g"] > 0.5
                rec["scores"].append(st["score"])
                rec["g"].append(st["g"])
                rec["fired"].append(fired)
                rec["engaged"].append(on)
                if scope == "next_step":
                    st["pulse"] = fired
                elif scope.startswith("rest_of_"):
                    st["sticky"] = st["sticky"] or fired
    finally:
        for hk in hs:
            hk.remove()
    return {"tokens": toks, "logprobs": lps, **rec}


def _margin_ok(scores: List[Optional[float]], thr: float, upto: int) -> bool:
    return all(s is not None and abs(s - thr) > MARGIN for s in scores[:upto])


def _threshold(base: List[float], scope: str) -> Optional[float]:
    """A threshold for the scores ``base`` of the request's decode steps without its gate:
    this_token, just under their median (fires at about half); the host scopes, halfway from
    the first step's score to the highest of the steps after it but the last, so the gate holds
    at the first step and fires at one whose effect (from the next step on) reaches a token."""
    if len(base) < 4:
        return None
    if scope == "this_token":
        return sorted(base)[len(base) // 2] - MARGIN * 1.5
    later = max(base[1:len(base) - 1])
    if later - base[0] < 4 * MARGIN:
        return None
    return (base[0] + later) / 2


def pick(model: Any, name: str, spec: Tuple[int, int, bool, Optional[Tuple[str, str, str, float]], int]) -> Dict[str, Any]:
    """The request's prompt (first salt that works) and threshold, with its reference runs."""
    n, mt, has_own, gate, _turn = spec
    own_v = own(name) if has_own else None
    for salt, sign in ((s, g) for s in range(40) for g in (1, -1)):
        ids = prompt(name, n, salt)
        base = ref_run(model, ids, mt, own_v, gate, 0.0, inert=True, sign=sign)
        thr = 0.0
        if gate is not None and gate[1] == "probe":
            t = _threshold(base["scores"], gate[0])
            if t is None:
                continue
            thr = t
        ref = ref_run(model, ids, mt, own_v, gate, thr, sign=sign)
        if gate is not None:
            if ref["tokens"] == base["tokens"]:
                continue  # the gate must change the tokens
            if gate[1] == "probe":
                upto = len(ref["scores"]) if gate[0] in ("this_token", "next_step") else ref["fired"].index(True) + 1
                if not any(ref["fired"]) or all(ref["fired"]) or not _margin_ok(ref["scores"], thr, upto):
                    continue
        return {"prompt": ids, "max_tokens": mt, "thr": thr, "sign": sign, "ref": ref, "base": base}
    raise RuntimeError(f"no prompt makes request {name}'s gate both hold and fire")


def pick_turn2(model: Any, first: Dict[str, Any]) -> Dict[str, Any]:
    """The second turn's prompt: one where starting engaged gives other tokens than the gate
    evaluated afresh would."""
    gate = REQS["rc"][3]
    name, n, mt = TURN2
    for salt in range(40):
        ids = prompt(name, n, salt)
        ref = ref_run(model, ids, mt, None, gate, first["thr"], engaged=True, sign=first["sign"])
        fresh = ref_run(model, ids, mt, None, gate, first["thr"], sign=first["sign"])
        if ref["tokens"] != fresh["tokens"]:
            return {"prompt": ids, "max_tokens": mt, "thr": first["thr"], "sign": first["sign"], "ref": ref,
                    "fresh": fresh}
    raise RuntimeError("no second-turn prompt tells an inherited engagement apart")


def plan(path: str) -> Dict[str, Any]:
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    reqs = {name: pick(model, name, spec) for name, spec in REQS.items()}
    reqs[TURN2[0]] = pick_turn2(model, reqs["rc"])
    for name, r in reqs.items():
        r["unsteered"] = ref_run(model, r["prompt"], r["max_tokens"], None, None, 0.0)["tokens"]
    return reqs


def extra(name: str, r: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    if name == TURN2[0]:
        return {"conversation_id": CONV_ID}
    _n, _mt, has_own, gate, turn = REQS[name]
    out: Dict[str, Any] = {}
    if has_own:
        out["steering_vectors"] = packed("post_block", 0, own(name))
    if gate is not None:
        out["steering"] = gate_json(gate, r["thr"], r["sign"])
    if turn:
        out["conversation_id"] = CONV_ID
    return out or None


def run_vllm(path: str, reqs: Dict[str, Any], compiled: bool = False) -> Dict[str, Any]:
    os.environ.setdefault("SHMSTEER_VLLM", "1")
    ns = os.environ.setdefault("SHMSTEER_NAMESPACE", "e2eg-" + uuid.uuid4().hex[:12])
    secret = os.environ.setdefault("SHMSTEER_SECRET", uuid.uuid4().hex)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if os.environ.get("SHMSTEER_E2E_ENTRY_POINT") != "1":
        import shmsteer.vllm
        shmsteer.vllm.register()
    import shmsteer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    llm = LLM(model=path, skip_tokenizer_init=True, dtype="float32", enforce_eager=not compiled,
              compilation_config={"mode": 3 if compiled else 0}, max_model_len=128, max_num_seqs=16,
              max_num_batched_tokens=48, enable_prefix_caching=False, seed=0)
    with shmsteer.Client(ns, secret) as c:
        c.register_vector(PROBE, [("post_block", 0, 1.0, probe().numpy())], kind="probe")
        c.register_vector(PROBE_NEG, [("post_block", 0, 1.0, probe(-1).numpy())], kind="probe")
        c.register_vector(CALM, [("post_block", 1, 1.0, calm().numpy())])

    def sp(mt: int, ex: Optional[Dict[str, Any]]) -> Any:
        return SamplingParams(temperature=0.0, max_tokens=mt, ignore_eos=True, logprobs=0, detokenize=False,
                              extra_args=ex)

    out: Dict[str, Any] = {"tokens": {}, "logprobs": {}}

    def gen(names: List[str]) -> None:
        res = llm.generate([TokensPrompt(prompt_token_ids=reqs[n]["prompt"]) for n in names],
                           [sp(reqs[n]["max_tokens"], extra(n, reqs[n])) for n in names])
        for n, o in zip(names, res):
            c = o.outputs[0]
            out["tokens"][n] = list(c.token_ids)
            out["logprobs"][n] = [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)]

    gen(list(REQS))  # one batch: every scope and apply kind at once
    gen([TURN2[0], "u0"])  # the conversation's second turn, once the first has finished
    out["refused"] = refused(llm, sp, reqs["u0"]["prompt"])
    from shmsteer.vllm.engine import engine_admissions
    adm = engine_admissions()
    out["live_after"] = None if adm is None else adm.live()
    out["compiled"] = compiled_facts(llm)
    return out


def compiled_facts(llm: Any) -> Dict[str, Any]:
    """How the worker's model ran: vLLM's compilation mode and whether the plugin's sites are the
    compiled ones (one operator call each in the graph) or eager hooks."""
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    mode = runner.vllm_config.compilation_config.mode
    st = runner.__dict__.get("_shmsteer")
    sites = None if st is None else st.sites
    return {"mode": getattr(mode, "name", str(mode)), "sites_compiled": bool(sites is not None and sites.compiled),
            "steps": None if st is None else st.steps,
            "hooks_mode": None if st is None or st.hooks is None else st.hooks.mode}


def refused(llm: Any, sp: Any, ids: List[int]) -> Dict[str, Any]:
    """A gate the owner refuses (attenuate with a this_token probe), submitted alone: what
    LLM.generate raised (the frontend's gate check refuses it before it reaches the engine, with
    the engine's typed error), what the engine logged about it, and the tokens of an unsteered
    request generated next."""
    from vllm.inputs import TokensPrompt
    logged: List[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(record.getMessage())

    out: Dict[str, Any] = {"raised": None, "message": None, "finish_reason": None}
    h = Keep(logging.WARNING)
    logging.getLogger("shmsteer.vllm").addHandler(h)
    try:
        res = llm.generate([TokensPrompt(prompt_token_ids=ids)], [sp(4, {"steering": gate_json(REFUSED, 0.0)})])
        out["finish_reason"] = res[0].outputs[0].finish_reason
    except ValueError as e:
        out["raised"], out["message"] = [c.__name__ for c in type(e).__mro__], str(e)
    finally:
        logging.getLogger("shmsteer.vllm").removeHandler(h)
    res = llm.generate([TokensPrompt(prompt_token_ids=ids)], [sp(4, None)])
    out["logged"] = [m for m in logged if "refused" in m]
    out["other"] = list(res[0].outputs[0].token_ids)
    return out


def main() -> None:
    path = sys.argv[1]
    assert HIDDEN == 256
    if not os.path.exists(os.path.join(path, "config.json")):
        make_model(path)
    reqs = plan(path)
    res = {"hf": {n: {k: v for k, v in r.items()} for n, r in reqs.items()}}
    res["vllm"] = run_vllm(path, reqs, compiled=sys.argv[2:] == ["compile"])
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
