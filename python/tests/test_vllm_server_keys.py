"""The seed's key registry across vLLM's processes, over vLLM's OpenAI server (CPU build).

The server runs from an alternative entrypoint (vllm_server_keys_run.py, as the seed's): the
registry's manager lives in the API server's process, and
``shmsteer.vllm.requests.bind_key_registry`` sets a request's key there when the request enters
vLLM's engine, under vLLM's internal id (the client's id plus a random suffix, which vLLM's
frontend makes), and revokes it when the request finishes. A probe plugin in the worker process
(vllm_keyprobe.py, declared through a ``vllm.general_plugins`` entry point of a dist-info written
here) reads the registry at every step under the ids of its batch and of earlier steps. Checks:
two concurrent requests with different keys read their own key at every decode step in the
worker (another process than the API server), under an id that is not the client's; after they
finish, a later request's steps read them revoked (the sentinel), and the server goes on.

Needs vLLM importable (docs/vllm.md); skipped otherwise. About 3 to 4 minutes on the 2-core VM.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

import pytest

from test_vllm_e2e import NO_VLLM

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=NO_VLLM)

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_TOKENS = 6
KEYS = {"a": os.urandom(32).hex(), "b": os.urandom(32).hex()}


def _probe_dist(path: str) -> None:
    """A dist-info on PYTHONPATH whose vllm.general_plugins entry point is vllm_keyprobe:register."""
    d = os.path.join(path, "shmsteer_keyprobe-0.0.dist-info")
    os.makedirs(d)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: shmsteer-keyprobe\nVersion: 0.0\n")
    with open(os.path.join(d, "entry_points.txt"), "w") as f:
        f.write("[vllm.general_plugins]\nshmsteer_keyprobe = vllm_keyprobe:register\n")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Dict[str, Any]:
    import vllm_server_run as vs
    tmp = tmp_path_factory.mktemp("keys")
    model = str(tmp / "model")
    os.mkdir(model)
    vs.make_model_dir(model)
    dist = str(tmp / "dist")
    _probe_dist(dist)
    probe_out = str(tmp / "probe.jsonl")
    env = vs.serve_env(uuid.uuid4().hex, "keys-" + uuid.uuid4().hex[:12])
    env.update(SHMSTEER_KEY_REGISTRY_NAMESPACE="keyreg-" + uuid.uuid4().hex[:12], SHMSTEER_KEYPROBE_OUT=probe_out,
               PYTHONPATH=os.pathsep.join([env["PYTHONPATH"], HERE, dist]))
    port = vs.free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [sys.executable, os.path.join(HERE, "vllm_server_keys_run.py"), "--model", model, "--host", "127.0.0.1",
            "--port", str(port), *vs.SERVE_FLAGS]
    log = str(tmp / "serve.log")
    proc = vs.start_server(argv, env, log)
    try:
        vs.wait_health(base, proc, log)
        prompt = [5, 9, 13, 17, 21, 25, 29]
        bodies = [vs.completion(prompt, MAX_TOKENS, {"output_key": KEYS[k]}) for k in ("a", "b")]
        with ThreadPoolExecutor(2) as ex:
            keyed = list(ex.map(lambda b: vs.post(base, "/v1/completions", b), bodies))
        later = vs.post(base, "/v1/completions", vs.completion(prompt, MAX_TOKENS))
        alive = proc.poll() is None
    finally:
        vs.stop(proc)
    with open(probe_out) as f:
        lines = [json.loads(ln) for ln in f]
    return {"keyed": keyed, "later": later, "lines": lines, "pid": proc.pid, "alive": alive, "log": log}


def _internal_ids(run: Dict[str, Any], external: str) -> List[str]:
    ids = {rid for ln in run["lines"] for rid in ln["scheduled"]}
    return sorted(rid for rid in ids if rid.startswith(external + "-"))


def test_requests_are_answered(run):
    for status, body in run["keyed"] + [run["later"]]:
        assert status == 200, body
        assert len(body["choices"][0]["token_ids"]) == MAX_TOKENS, body
    assert run["alive"], "the server went on"


def test_the_worker_reads_each_requests_key_at_every_decode_step(run):
    for (status, body), name in zip(run["keyed"], ("a", "b")):
        ids = _internal_ids(run, body["id"] + "-0")
        assert len(ids) == 1, (body["id"], ids)
        rid = ids[0]
        assert rid != body["id"] + "-0", "the worker sees vLLM's internal id, not the client's"
        steps = [ln["scheduled"][rid] for ln in run["lines"] if rid in ln["scheduled"]]
        decode = [key for n, key in steps if n == 1]
        assert len(decode) >= MAX_TOKENS - 1, steps
        assert all(key == KEYS[name] for _, key in steps), steps
    assert all(ln["pid"] != run["pid"] for ln in run["lines"]), "read in another process than the API server"


def test_keys_are_revoked_when_their_requests_finish(run):
    status, later = run["later"]
    rid_later = _internal_ids(run, later["id"] + "-0")
    assert len(rid_later) == 1
    after = [ln for ln in run["lines"] if rid_later[0] in ln["scheduled"]]
    assert after
    for status, body in run["keyed"]:
        rid = _internal_ids(run, body["id"] + "-0")[0]
        assert all(ln["earlier"][rid] == "revoked" for ln in after), [ln["earlier"] for ln in after]
    assert all(ln["scheduled"][rid_later[0]][1] == "missing" for ln in after), "no key for a request without one"
