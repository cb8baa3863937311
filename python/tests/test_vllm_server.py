"""End to end over HTTP: vLLM's OpenAI server (``vllm serve``, CPU build) steered by the shmsteer
plugin, against transformers.

One server on loopback (a free port; the random tiny Llama of vllm_e2e_run.py with a word-level
tokenizer made on the spot; SHMSTEER_VLLM=1 and a secret; the owner in vLLM's engine process),
then /v1/completions requests with steering in ``vllm_xargs`` (the fork's packed vectors as JSON
text, and ``steering_name`` naming a vector registered through a ``shmsteer.Client``), sent
together so steered and unsteered requests share batches. Each steered request's greedy tokens
must equal transformers with the vector added by a plain hook, logprobs within float32's
tolerance; unsteered ones equal transformers unsteered. Refused steering (a bad dtype, a wrong
shape, an unknown hook, an unknown named vector, JSON that does not parse, a gate the owner
refuses: attenuate with a this_token probe, an unknown scope, a gate naming a vector the owner
does not have, an inline probe at two sites, an inline gate vector of the wrong width) is a 400
with the fork's text (the engine's, for gates), and the server answers the next request as before. The server's process group is
stopped at the end.

Needs vLLM importable (docs/vllm.md); skipped otherwise. About 3 to 4 minutes on the 2-core VM,
most of it vLLM's start.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

import pytest

from test_vllm_e2e import NO_VLLM

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=NO_VLLM)

MAX_TOKENS = 8  # as vllm_e2e_run.MAX_TOKENS, which its _greedy (the reference) decodes
PROMPTS = [[(5 * i + 11 * j + 7) % 250 + 3 for j in range(n)] for i, n in enumerate((9, 17, 6, 12, 7))]
# (hook, layer) of an inline vector per request, "named" for steering_name, None unsteered
STEER: List[Any] = [("post_block", 0), None, ("mlp_out", 1), "named", None]
NAMED = ("post_attn", 1)


def _named_vector() -> Any:
    from vllm_e2e_run import vector
    return 0.8 * vector(40)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import vllm_server_run as vs
    model = str(tmp_path_factory.mktemp("tiny-llama-srv"))
    vs.make_model_dir(model)
    secret, ns = uuid.uuid4().hex, "srv-" + uuid.uuid4().hex[:12]
    port = vs.free_port()
    log = os.path.join(model, "serve.log")
    proc = vs.start_server(vs.serve_argv(model, port), vs.serve_env(secret, ns), log)
    base = f"http://127.0.0.1:{port}"
    try:
        vs.wait_health(base, proc, log)
        yield {"base": base, "model": model, "secret": secret, "ns": ns, "log": log, "proc": proc}
    finally:
        rc = vs.stop(proc)
        print(f"server stopped: {rc}")


@pytest.fixture(scope="module")
def answers(server) -> Dict[str, Any]:
    """Every request of STEER sent at once, after registering the named vector."""
    import shmsteer
    from vllm_e2e_run import packed, vector
    import vllm_server_run as vs
    with shmsteer.Client(server["ns"], secret=server["secret"].encode()) as c:
        c.register_vector("srv-named", [(NAMED[0], NAMED[1], 1.0, _named_vector().numpy())])
    bodies = []
    for i, s in enumerate(STEER):
        xargs: Optional[Dict[str, Any]] = None
        if s == "named":
            xargs = {"steering_name": "srv-named"}
        elif s is not None:
            xargs = {"steering_vectors": packed(s[0], s[1], vector(i))}
        bodies.append(vs.completion(PROMPTS[i], MAX_TOKENS, xargs))
    with ThreadPoolExecutor(len(bodies)) as ex:
        got = list(ex.map(lambda b: vs.post(server["base"], "/v1/completions", b), bodies))
    return {"answers": got}


@pytest.fixture(scope="module")
def reference(server) -> Dict[str, Any]:
    """transformers on the same weights: each prompt unsteered and with its vector by a plain hook."""
    import torch
    from transformers import LlamaForCausalLM
    from vllm_e2e_run import _greedy, _hook, vector
    model = LlamaForCausalLM.from_pretrained(server["model"], torch_dtype=torch.float32).eval()
    out: Dict[str, Any] = {"tokens": [], "logprobs": [], "unsteered": []}
    for i, (prompt, s) in enumerate(zip(PROMPTS, STEER)):
        out["unsteered"].append(_greedy(model, prompt)[0])
        h = None
        if s == "named":
            h = _hook_any(model, NAMED[0], NAMED[1], _named_vector())
        elif s is not None:
            h = _hook(model, s[0], s[1], vector(i))
        toks, lps = _greedy(model, prompt)
        if h is not None:
            h.remove()
        out["tokens"].append(toks)
        out["logprobs"].append(lps)
    return out


def _hook_any(model: Any, hook: str, layer: int, v: Any) -> Any:
    """vllm_e2e_run's plain hooks plus post_attn: the stream after attention's add, so v goes
    into attention's output (the MLP's input and the residual both carry it)."""
    if hook != "post_attn":
        from vllm_e2e_run import _hook
        return _hook(model, hook, layer, v)
    return model.model.layers[layer].self_attn.register_forward_hook(
        lambda _m, _a, o: (o[0] + v,) + tuple(o[1:]))


def _choice(answer: Tuple[int, Dict[str, Any]]) -> Dict[str, Any]:
    status, body = answer
    assert status == 200, body
    return body["choices"][0]


def test_steered_requests_equal_transformers_with_a_plain_hook(answers, reference):
    for i, s in enumerate(STEER):
        c = _choice(answers["answers"][i])
        assert c["token_ids"] == reference["tokens"][i], f"request {i} steered {s}"
        for a, b in zip(c["logprobs"]["token_logprobs"], reference["logprobs"][i]):
            assert abs(a - b) < 2e-3, f"request {i} steered {s}: logprob {a} vs {b}"


def test_unsteered_requests_equal_an_unsteered_run(answers, reference):
    for i, s in enumerate(STEER):
        if s is None:
            assert _choice(answers["answers"][i])["token_ids"] == reference["unsteered"][i], f"request {i}"


def test_the_vectors_change_the_tokens(reference):
    """Without this the equalities above could hold with steering silently off."""
    for i, s in enumerate(STEER):
        if s is not None:
            assert reference["tokens"][i] != reference["unsteered"][i], f"request {i}: {s} changes nothing"


def _packed_raw(hook: str, dtype: str, shape: List[int], data: bytes, layers: Tuple[int, ...] = (0,)) -> str:
    return json.dumps({hook: {"dtype": dtype, "shape": shape, "layer_indices": list(layers),
                              "data": base64.b64encode(data).decode("ascii")}})


_PROBE = {"kind": "probe", "probe": {"kind": "name", "name": "srv-probe"}, "threshold": 0.0}


def _gate(scope: str, when: Dict[str, Any], apply: Dict[str, Any]) -> Dict[str, Any]:
    return {"when": when, "scope": scope, "apply": apply}


REFUSED = {
    "bad dtype": ({"steering_vectors": _packed_raw("post_block", "int8", [1, 256], bytes(256))},
                  "SteeringHookPacked.dtype 'int8': want float16, bfloat16, float32 or float64"),
    "wrong shape": ({"steering_vectors": _packed_raw("post_block", "float32", [1, 8], bytes(32))},
                    "steering_vectors['post_block'][0]: vector width 8 != expected steering row width 256 "
                    "(model hidden size)"),
    "data not the shape": ({"steering_vectors": _packed_raw("post_block", "float32", [1, 256], bytes(64))},
                           "SteeringHookPacked.data length 64 != expected 1024 (shape=(1, 256), dtype=float32)"),
    "unknown hook": ({"steering_vectors": _packed_raw("attn_out", "float32", [1, 256], bytes(1024))},
                     "steering_vectors key 'attn_out' is not a valid hook point. Valid values: "
                     "['mlp_in', 'mlp_out', 'post_attn', 'post_block', 'pre_attn']"),
    "unknown named vector": ({"steering_name": "no-such-vector"},
                             "Unknown steering module 'no-such-vector'. Available: ['srv-named']"),
    "not JSON": ({"steering_vectors": "{not json"}, "steering_vectors: vllm_xargs value is not JSON"),
    # gates the owner refuses for their form: the frontend's check is the owner's (shmsteer_gates_check)
    "unsupported gate": ({"steering": json.dumps([_gate("this_token", _PROBE, {"kind": "attenuate", "strength": 0.5})])},
                         "steering[0]: shmsteer: unsupported steering gate: attenuate with when=probe and "
                         "scope=this_token is not supported"),
    "bad gate": ({"steering": json.dumps([_gate("forever", {"kind": "always"}, {"kind": "attenuate", "strength": 0})])},
                 'steering[0]: shmsteer: bad steering gate: scope: "forever" is not one of this_token, next_step, '
                 "rest_of_request, rest_of_conversation"),
    # gates the owner refuses for its vectors and model: the frontend checks them at the owner's
    # current version (shmsteer_gates_check_at), the owner's text without the internal request id
    "gate naming an unknown vector": (
        {"steering": json.dumps([_gate("next_step", {"kind": "always"},
                                       {"kind": "add", "steer": {"kind": "name", "name": "no-such-vector"}})])},
        'shmsteer: unknown named vector: steering[0].apply.steer: unknown steering vector name "no-such-vector"'),
    "probe at two sites": (
        {"steering": json.dumps([_gate("next_step", {**_PROBE, "probe": {"kind": "inline", "packed": json.loads(
            _packed_raw("post_block", "float32", [2, 256], bytes(2048), (0, 1)))}},
            {"kind": "attenuate", "strength": 0.5})])},
        "shmsteer: a probe vector must name exactly one (hook, layer): steering[0].when.probe: an inline probe names "
        "2 sites"),
    "gate vector of the wrong width": (
        {"steering": json.dumps([_gate("next_step", {"kind": "always"}, {"kind": "add", "steer": {
            "kind": "inline", "packed": json.loads(_packed_raw("post_block", "float32", [1, 8], bytes(32)))}})])},
        "steering[0].apply.steer: shmsteer: vector length is not the hidden size: base vector 0 has 8 floats, "
        "hidden size is 256"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_steering_is_a_400_with_the_forks_text(server, answers, case):
    import vllm_server_run as vs
    xargs, text = REFUSED[case]
    status, body = vs.post(server["base"], "/v1/completions", vs.completion(PROMPTS[1], MAX_TOKENS, xargs))
    assert status == 400, body
    assert text in body["error"]["message"], body
    assert body["error"]["type"] == "BadRequestError", body


def test_the_server_keeps_serving_after_refusals(server, answers, reference):
    import vllm_server_run as vs
    for case in sorted(REFUSED):
        status, _ = vs.post(server["base"], "/v1/completions", vs.completion(PROMPTS[1], MAX_TOKENS, REFUSED[case][0]))
        assert status == 400, case
    assert _choice(vs.post(server["base"], "/v1/completions", vs.completion(PROMPTS[1], MAX_TOKENS)))["token_ids"] \
        == reference["unsteered"][1]
    assert server["proc"].poll() is None, vs.tail(server["log"])
