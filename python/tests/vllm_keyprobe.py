"""A vLLM general plugin for test_vllm_server_keys.py: in every worker, before each model step,
read the seed's key registry (:mod:`shmsteer.keyregistry`) under each request id of the step (the
id the worker sees) and under every id seen before, and append one JSON line to
``$SHMSTEER_KEYPROBE_OUT``: ``{"pid", "scheduled": {id: [tokens this step, key]}, "earlier": {id:
key}}``, a key being its hex, ``"revoked"`` (the sentinel) or ``"missing"``.

The test declares it through a ``vllm.general_plugins`` entry point of a dist-info directory it
writes on ``PYTHONPATH``; without ``SHMSTEER_KEYPROBE_OUT`` it does nothing.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict


def _read(registry: Any, request_id: str) -> str:
    try:
        key = registry[request_id]
    except KeyError:
        return "missing"
    return "revoked" if key is None else key.hex()


def register() -> None:
    out = os.environ.get("SHMSTEER_KEYPROBE_OUT")
    if not out:
        return
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    if getattr(GPUModelRunner, "_keyprobe", False):
        return
    orig = GPUModelRunner.execute_model
    seen: Dict[str, None] = {}

    def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        from shmsteer import keyregistry
        registry = keyregistry.get_shared_registry()
        sched = dict(scheduler_output.num_scheduled_tokens)
        line = {"pid": os.getpid(),
                "scheduled": {rid: [n, _read(registry, rid)] for rid, n in sched.items()},
                "earlier": {rid: _read(registry, rid) for rid in seen if rid not in sched}}
        seen.update(dict.fromkeys(sched))
        if sched:
            with open(out, "a") as f:
                f.write(json.dumps(line) + "\n")
        return orig(self, scheduler_output, *args, **kwargs)

    GPUModelRunner.execute_model = execute_model
    GPUModelRunner._keyprobe = True
