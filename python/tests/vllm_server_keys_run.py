"""The seed's alternative entrypoint, for test_vllm_server_keys.py: start the key registry's
manager in this (the API server's) process, keep it in step with vLLM's requests through
:func:`shmsteer.vllm.requests.bind_key_registry` (a request's key is the hex of its
``vllm_xargs`` field ``output_key``), then run vLLM's OpenAI server here with the arguments given
(those of ``python -m vllm.entrypoints.openai.api_server``)::

    SHMSTEER_VLLM=1 SHMSTEER_SECRET=... python vllm_server_keys_run.py --model DIR --port 8000 ...
"""

from __future__ import annotations

from typing import Optional

from shmsteer import keyregistry
from shmsteer.vllm.requests import RequestStart, bind_key_registry


def key_for(req: RequestStart) -> Optional[bytes]:
    hexkey = req.extra_args.get("output_key")
    return None if hexkey is None else bytes.fromhex(str(hexkey))


def main() -> None:
    manager = keyregistry.registry_manager_main_process()
    next(manager)  # the registry lives as long as this process keeps `manager`
    bind_key_registry(keyregistry.get_shared_registry(), key_for)
    from vllm.entrypoints.launchers.api_server.entry import main as serve
    try:
        serve()
    finally:
        manager.close()


if __name__ == "__main__":
    main()
