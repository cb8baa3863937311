"""Activation capture through the vLLM plugin: the engine's owner declares the consumers, the
workers capture at the hook points, a consumer writes the fork's files.

A request asks for capture with the fork's ``capture`` field (``{consumer: spec}``, the spec the
fork's ``FilesystemCaptureRequest``: ``request_id``, ``tag``, ``hooks``, ``positions``,
``layout``; JSON text in ``vllm_xargs``), which the scheduler admits with the prompt's length.
The settings, read in the engine-core process where the owner lives (``SHMSTEER_VLLM_OWNER=
engine``):

``SHMSTEER_VLLM_CAPTURE``
    the consumers the owner declares, ``NAME=TYPE[,NAME=TYPE...]`` (type ``filesystem``), as
    ``shmsteer serve --capture-consumer``. A request naming another consumer fails (the owner's
    CaptureConsumerError, finish reason ``error``).
``SHMSTEER_VLLM_CAPTURE_DIR``
    a directory: the owner declares consumer ``fs`` (type ``filesystem``) and the engine process
    runs the filesystem consumer (:class:`shmsteer.capture.FilesystemConsumer`, what
    ``shmsteer capture fs`` runs) writing under it, ``{dir}/{tag}/{request_id}/`` in the fork's
    layout, which the fork's reader reads unchanged. Under data parallelism each engine has its
    own owner and consumer, and writes under ``{dir}/dp{rank}/`` (:func:`consumer_root`): a
    consumer removes the ``.tmp`` files under its root when it starts (what a killed one left),
    so engines sharing one root would delete the files a sibling is writing. Without it, run a
    consumer beside vLLM: ``shmsteer capture fs --namespace NS --root DIR`` (``SHMSTEER_SECRET``
    set as for vLLM; one per engine under data parallelism, each with its own root).
``SHMSTEER_VLLM_CAPTURE_GLOBAL``
    declared consumers' global specs, ``NAME=@FILE[,NAME=@FILE...]`` (serve's
    ``--capture-global``): every request that does not name that consumer is captured with the
    FILE's spec (JSON, without ``request_id``: each request is written under vLLM's internal
    id, the client's id with vLLM's suffix); a request's own spec replaces it.

Workers start capturing when their hooks are built, if the owner serves capture (with
``SHMSTEER_VLLM_OWNER=external`` too: ``shmsteer serve --capture-consumer``), each into a ring of
its own. The rows are the stream at each hook point (:mod:`shmsteer.vllm.layers`), taken before
the site is steered: a steered request captures the values its steering was added to. Under
tensor parallelism every rank holds the same stream, so only tensor-parallel rank 0 writes
(``writer_rank``): a request's rows are written once.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
from typing import Any, Dict, Optional, Tuple

from .errors import PluginConfigError

__all__ = ["FS_CONSUMER", "owner_capture", "consumer_root", "start_consumer", "stop_consumer",
           "start_worker_capture"]

log = logging.getLogger("shmsteer.vllm")

FS_CONSUMER = "fs"
"""The consumer name ``SHMSTEER_VLLM_CAPTURE_DIR`` declares and writes as."""

_state: Dict[str, Any] = {"fs": None}


def _pairs(var: str, sep: str) -> Dict[str, str]:
    raw = os.environ.get(var, "")
    out: Dict[str, str] = {}
    for item in (s.strip() for s in raw.split(",")):
        if not item:
            continue
        name, ok, value = item.partition(sep)
        name, value = name.strip(), value.strip()
        if not ok or not name or not value:
            raise PluginConfigError(f"{var}: {item!r}, want NAME{sep}{'FILE' if sep == '=@' else 'TYPE'}[,...]")
        if name in out:
            raise PluginConfigError(f"{var}: {name!r} given twice")
        out[name] = value
    return out


def owner_capture() -> Tuple[Dict[str, str], Dict[str, Any], Optional[str]]:
    """(consumers ``{name: type}``, global specs ``{name: spec}``, the filesystem consumer's
    directory or None) of the settings above. A bad type or name is the owner's typed error
    when it starts; a malformed setting, an unreadable FILE or one that is not JSON is
    :class:`PluginConfigError` here."""
    consumers = _pairs("SHMSTEER_VLLM_CAPTURE", "=")
    root = os.environ.get("SHMSTEER_VLLM_CAPTURE_DIR", "").strip() or None
    if root is not None:
        if consumers.get(FS_CONSUMER, "filesystem") != "filesystem":
            raise PluginConfigError(f"SHMSTEER_VLLM_CAPTURE_DIR writes as consumer {FS_CONSUMER!r}, which "
                                    f"SHMSTEER_VLLM_CAPTURE declares as {consumers[FS_CONSUMER]!r}")
        consumers[FS_CONSUMER] = "filesystem"
    specs: Dict[str, Any] = {}
    for name, path in _pairs("SHMSTEER_VLLM_CAPTURE_GLOBAL", "=@").items():
        if name not in consumers:
            raise PluginConfigError(f"SHMSTEER_VLLM_CAPTURE_GLOBAL: {name!r} is not a declared consumer "
                                    f"({sorted(consumers) or 'none'}: SHMSTEER_VLLM_CAPTURE, SHMSTEER_VLLM_CAPTURE_DIR)")
        try:
            with open(path, encoding="utf-8") as f:
                specs[name] = json.load(f)
        except (OSError, ValueError) as e:
            raise PluginConfigError(f"SHMSTEER_VLLM_CAPTURE_GLOBAL: {name}=@{path}: {e}") from None
    return consumers, specs, root


def consumer_root(root: str, dp_rank: int = 0, dp_size: int = 1) -> str:
    """The directory the filesystem consumer of data-parallel engine ``dp_rank`` (of
    ``dp_size``) writes under: ``root`` for one engine, ``root/dp{dp_rank}`` for several, so
    that no engine's start-up cleaning (the consumer removes every ``.tmp`` file under its
    root) reaches a sibling's files in flight."""
    if dp_size < 1 or not 0 <= dp_rank < dp_size:
        raise PluginConfigError(f"data-parallel rank {dp_rank} of {dp_size}: want 0 <= rank < size")
    return os.path.join(root, f"dp{dp_rank}") if dp_size > 1 else root


def start_consumer(namespace: str, root: str, dp_rank: int = 0, dp_size: int = 1) -> Any:
    """Run the filesystem consumer ``fs`` in this process (the owner's, which must declare it)
    writing under :func:`consumer_root` of ``root`` for data-parallel engine ``dp_rank`` of
    ``dp_size``, stopped at exit."""
    from ..capture import FilesystemConsumer
    stop_consumer()
    root = consumer_root(root, dp_rank, dp_size)
    _state["fs"] = FilesystemConsumer(namespace, root, name=FS_CONSUMER)
    atexit.register(stop_consumer)
    log.info("shmsteer: capture consumer %r writing under %s", FS_CONSUMER, root)
    return _state["fs"]


def stop_consumer() -> Optional[Dict[str, int]]:
    """Stop the filesystem consumer :func:`start_consumer` started (requests not ended are
    abandoned); its counters, or None when none runs."""
    fs, _state["fs"] = _state["fs"], None
    return fs.stop() if fs is not None else None


def _tp_rank() -> int:
    try:
        from vllm.distributed import parallel_state
        return int(parallel_state.get_tensor_model_parallel_rank())
    except (ImportError, AssertionError, AttributeError, RuntimeError):
        return 0  # no tensor-parallel group: one rank


def start_worker_capture(hooks: Any, rank: Optional[int] = None) -> bool:
    """Start ``hooks``' capture (:meth:`SteeringHooks.start_capture`) as tensor-parallel rank
    ``rank`` (default: this worker's), rank 0 writing, if the owner serves capture; returns
    whether it does (False: the owner declares no consumer, nothing is captured)."""
    from ..errors import NoHubError
    try:
        hooks.start_capture(rank=_tp_rank() if rank is None else rank, writer_rank=0)
    except NoHubError:
        return False
    return True
