"""shmsteer for a stock vLLM: a ``vllm.general_plugins`` plugin steering, gating and capturing
any request with the vLLM fork's request fields.

This subpackage owns the glue between vLLM's engine and shmsteer's engine; it imports vLLM only
when :func:`register` runs in a vLLM process. It is off unless ``SHMSTEER_VLLM=1``; then, in every
process vLLM loads its plugins in (API server, engine core, workers), :func:`register` installs,
once per process:

* the frontend's check of the fork's request fields (a refused body is a 400 with the fork's text),
* the frontend's request events under vLLM's internal ids (:func:`shmsteer.vllm.requests.on_request`,
  :func:`shmsteer.vllm.requests.bind_key_registry` for the seed's key registry),
* the owner and the admissions beside vLLM's scheduler (:mod:`shmsteer.vllm.engine`),
* the workers' steering at the fork's hook points (:mod:`shmsteer.vllm.worker`,
  :mod:`shmsteer.vllm.layers`), spans resolved once per step from the runner's batch
  (:mod:`shmsteer.vllm.spans`).

How to start (offline)::

    SHMSTEER_VLLM=1 SHMSTEER_SECRET=... VLLM_WORKER_MULTIPROC_METHOD=spawn python3 - <<'EOF'
    from vllm import LLM, SamplingParams
    llm = LLM(model="dir", enforce_eager=True, compilation_config={"mode": 0})
    sp = SamplingParams(max_tokens=8, extra_args={"steering_vectors": {"post_block": {
        "dtype": "float32", "shape": [1, 4096], "layer_indices": [10], "data": "<base64>"}}})
    print(llm.generate(["Hello"], sp))
    EOF

and served: ``SHMSTEER_VLLM=1 SHMSTEER_SECRET=... vllm serve DIR -O0 --enforce-eager``, the
steering fields in ``vllm_xargs`` (structured fields as JSON text, see
:mod:`shmsteer.vllm.requests`). Settings: ``SHMSTEER_NAMESPACE`` (default ``vllm``),
``SHMSTEER_SECRET`` / ``SHMSTEER_SECRET_FILE``, ``SHMSTEER_VLLM_OWNER`` (``engine`` or
``external``), ``SHMSTEER_VLLM_HOOKS`` (hook points to attach), ``SHMSTEER_VLLM_ATTACH_TIMEOUT``,
``SHMSTEER_VLLM_STATIC`` (static mode, for CUDA graphs: :mod:`shmsteer.vllm.static`).

The Go runtime in libshmsteer does not survive ``fork``: :func:`register` makes vLLM start its
processes with ``spawn`` (``VLLM_WORKER_MULTIPROC_METHOD``) unless it was set.
"""

from __future__ import annotations

import logging
import os

from .errors import (BatchLayoutError, CompiledModelError, CudaGraphModeError, PluginConfigError, SitesNotAttachedError,
                     UnsupportedModelError, VllmPluginError)

__all__ = ["register", "enabled", "VllmPluginError", "BatchLayoutError", "CompiledModelError",
           "CudaGraphModeError", "SitesNotAttachedError",
           "PluginConfigError", "UnsupportedModelError"]

log = logging.getLogger("shmsteer.vllm")

_registered = False


def enabled() -> bool:
    """Whether ``SHMSTEER_VLLM`` turns the plugin on (``1``, ``true``, ``on``, ``yes``)."""
    return os.environ.get("SHMSTEER_VLLM", "").strip().lower() in ("1", "true", "on", "yes")


def register() -> None:
    """The ``vllm.general_plugins`` entry point: install the plugin in this process, once.

    Does nothing unless :func:`enabled`. Raises :class:`PluginConfigError` for a bad setting;
    ImportError when vLLM lacks the classes patched (a vLLM this plugin does not know)."""
    global _registered
    if _registered or not enabled():
        return
    from . import engine, worker
    engine.owner_mode()  # PluginConfigError early, in every process
    method = os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    if method != "spawn":
        log.warning("shmsteer: VLLM_WORKER_MULTIPROC_METHOD=%s; libshmsteer needs spawn in processes it runs in", method)
    engine.patch_frontend()
    engine.patch_output_processor()
    engine.patch_scheduler()
    worker.patch_runners()
    _registered = True
    log.info("shmsteer: vLLM plugin installed in process %d", os.getpid())
