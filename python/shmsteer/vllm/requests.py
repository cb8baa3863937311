"""Per-request steering of a vLLM request: from ``SamplingParams.extra_args`` to ``Owner.admit``.

vLLM carries extra per-request data in ``SamplingParams.extra_args``; the OpenAI server fills it
from the request's ``vllm_xargs``, whose values are strings, numbers or lists of them, so the
fork's structured fields arrive as JSON text::

    {"vllm_xargs": {"steering_vectors": "{\\"post_block\\": {\\"dtype\\": \\"float32\\", ...}}",
                    "conversation_id": "chat-7"}}

Offline (``LLM.generate``) the same fields may be given decoded
(``SamplingParams(extra_args={"steering_vectors": {...}})``). :func:`steering_body` decodes them
into the request body the fork's frontend would have seen; :func:`admission_for` translates that
with :func:`shmsteer.openai.admission_from_request` (the fork's checks and 400 texts) and adds
``capture`` and the prompt's length. :class:`Admissions` admits and ends the requests of one
owner, keyed by vLLM's internal request id (the id workers see), remembering the client's id.

The frontend's request events: :func:`on_request` calls listeners when a request enters vLLM's
engine (with its internal id, which vLLM's frontend makes: the client's id plus a random suffix)
and when it leaves; :func:`bind_key_registry` keeps the seed's key registry
(:mod:`shmsteer.keyregistry`) in step with them, so a worker reads a request's key under the id
it sees.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, MutableMapping, Optional, Sequence, Set, Tuple

from ..openai import SteeringRequestError, admission_from_request

__all__ = ["STRUCTURED_FIELDS", "STRING_FIELDS", "steering_body", "admission_for", "Admissions", "RequestStart",
           "on_request", "bind_key_registry", "request_started", "request_ended"]

log = logging.getLogger("shmsteer.vllm")

STRUCTURED_FIELDS: Tuple[str, ...] = (
    "steering_vectors", "prefill_steering_vectors", "decode_steering_vectors",
    "steering_clamps", "prefill_steering_clamps", "decode_steering_clamps",
    "steering", "capture")
"""The fork's request fields whose values are JSON objects or lists (JSON text in ``vllm_xargs``)."""

STRING_FIELDS: Tuple[str, ...] = ("steering_name", "conversation_id", "steering_tenant")
"""The fork's string fields (``steering_tenant``: shmsteer's conversation tenant, default "")."""


def steering_body(extra_args: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The steering fields of ``extra_args`` as a decoded request body (``{}`` without any).

    A structured field given as a string is parsed as JSON; other fields of ``extra_args`` are
    left out (they belong to other plugins). Raises :class:`SteeringRequestError` (400) for JSON
    text that does not parse."""
    if not extra_args:
        return {}
    body: Dict[str, Any] = {}
    for field in STRUCTURED_FIELDS:
        v = extra_args.get(field)
        if v is None:
            continue
        if isinstance(v, (str, bytes)):
            try:
                v = json.loads(v)
            except ValueError as e:
                raise SteeringRequestError(f"{field}: vllm_xargs value is not JSON: {e}") from None
        body[field] = v
    for field in STRING_FIELDS:
        if extra_args.get(field) is not None:
            body[field] = extra_args[field]
    return body


def admission_for(extra_args: Optional[Mapping[str, Any]], prompt_len: int,
                  model: Optional[Tuple[int, int, Sequence[str]]] = None) -> Optional[Dict[str, Any]]:
    """``Owner.admit`` keyword arguments for a request, or None when it carries no steering,
    gates, capture or conversation.

    Args:
        extra_args: the request's ``SamplingParams.extra_args``.
        prompt_len: the prompt's length in tokens (capture positions resolve against it).
        model: ``Owner.model`` (hidden, layers, hooks) for the fork's width and hook checks.

    Raises:
        SteeringRequestError: the fork's 400 text (``err.status`` is 400).
    """
    body = steering_body(extra_args)
    if not body:
        return None
    kw = admission_from_request(body, model=model)
    if "capture" in body:
        if not isinstance(body["capture"], dict):
            raise SteeringRequestError(f"capture: Input should be a valid dictionary, got {type(body['capture']).__name__}")
        kw["capture"] = body["capture"]
        kw["prompt_len"] = int(prompt_len)
    tenant = body.get("steering_tenant")
    if tenant is not None:
        if not isinstance(tenant, str):
            raise SteeringRequestError(f"steering_tenant: Input should be a valid string, got {type(tenant).__name__}")
        kw["tenant"] = tenant
    return kw


class Admissions:
    """The steered requests of one owner: admit before a request's first step, end when it
    finishes or is aborted. Thread-safe; an id admitted twice is ended first (vLLM reuses an id
    only for a resumed streaming session).

    Args:
        owner: a :class:`shmsteer.Owner` (anything with ``admit``, ``end`` and ``model``).
    """

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self._model = owner.model
        self._live: Dict[str, str] = {}  # internal id -> the client's (external) id
        self._lock = threading.Lock()

    def admit(self, request_id: str, extra_args: Optional[Mapping[str, Any]], prompt_len: int,
              external_id: Optional[str] = None) -> bool:
        """Admit ``request_id`` (vLLM's internal id) if its ``extra_args`` carry steering;
        returns whether it was admitted. Raises :class:`SteeringRequestError` or the owner's typed
        refusals (:mod:`shmsteer.errors`); nothing is admitted then."""
        kw = admission_for(extra_args, prompt_len, self._model)
        if kw is None:
            return False
        with self._lock:
            if request_id in self._live:
                self.owner.end(request_id)
                del self._live[request_id]
            self.owner.admit(request_id, **kw)
            self._live[request_id] = external_id or request_id
        return True

    def end(self, request_id: str) -> bool:
        """End ``request_id`` if it was admitted; returns whether it was."""
        with self._lock:
            if self._live.pop(request_id, None) is None:
                return False
            self.owner.end(request_id)
        return True

    def external_id(self, request_id: str) -> Optional[str]:
        """The client's request id of a live internal id (vLLM appends a random suffix)."""
        with self._lock:
            return self._live.get(request_id)

    def live(self) -> Dict[str, str]:
        """A copy of the live admissions: internal id -> client id."""
        with self._lock:
            return dict(self._live)


@dataclass(frozen=True)
class RequestStart:
    """A request as the frontend hands it to vLLM's engine.

    Attributes:
        request_id: vLLM's internal id, the client's id plus a random suffix: the id the
            scheduler, the engine-core process and every worker see (``input_batch.req_ids``,
            ``SchedulerOutput.num_scheduled_tokens``).
        external_id: the client's id (the OpenAI server's ``cmpl-...-<index>``, ``LLM``'s counter).
        extra_args: the request's ``SamplingParams.extra_args`` (``vllm_xargs``), ``{}`` without.
    """

    request_id: str
    external_id: str
    extra_args: Mapping[str, Any]


StartListener = Callable[[RequestStart], None]
EndListener = Callable[[str], None]


class _Listeners:
    """The frontend's request listeners, and the internal ids started and not yet ended."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pairs: List[Tuple[Optional[StartListener], Optional[EndListener]]] = []
        self.live: Set[str] = set()

    def started(self, start: RequestStart) -> None:
        with self.lock:
            pairs = list(self.pairs)
            self.live.add(start.request_id)
        try:
            for fn, _ in pairs:
                if fn is not None:
                    fn(start)
        except BaseException:  # refused: undo what the listeners before it did, then refuse
            self.ended(start.request_id)
            raise

    def ended(self, request_id: str) -> None:
        with self.lock:
            if request_id not in self.live:
                return
            self.live.remove(request_id)
            pairs = list(self.pairs)
        for _, fn in pairs:
            if fn is None:
                continue
            try:
                fn(request_id)
            except Exception:  # an end listener must not break vLLM's output loop
                log.exception("shmsteer: request end listener failed for %s", request_id)


_listeners = _Listeners()


def on_request(start: Optional[StartListener] = None, end: Optional[EndListener] = None) -> Callable[[], None]:
    """Call ``start(RequestStart)`` when a request enters vLLM's engine and ``end(request_id)``
    when it finishes or is aborted, in the frontend process (the OpenAI server's API process, or
    ``LLM``'s), keyed by vLLM's internal request id. Returns a function that removes the pair.

    ``start`` runs in the frontend before the request is sent to the engine core, so whatever it
    publishes (a key in :mod:`shmsteer.keyregistry`, say) is visible to every worker at the
    request's first step; an exception from it refuses the request (a ``ValueError`` is a 400),
    with nothing sent to the engine. ``end`` runs once per started request, after its last output
    (finished, stopped, aborted or disconnected); its exceptions are logged. Needs the plugin
    installed in this process (``SHMSTEER_VLLM=1``; :func:`shmsteer.vllm.register`)."""
    pair = (start, end)
    with _listeners.lock:
        _listeners.pairs.append(pair)

    def remove() -> None:
        with _listeners.lock:
            if pair in _listeners.pairs:
                _listeners.pairs.remove(pair)
    return remove


def request_started(start: RequestStart) -> None:
    """What the plugin's frontend patch calls for a new request (runs the start listeners)."""
    _listeners.started(start)


def request_ended(request_id: str) -> None:
    """What the plugin's frontend patch calls when a request leaves (runs the end listeners once
    per started id; ids never started are ignored)."""
    _listeners.ended(request_id)


def bind_key_registry(registry: MutableMapping[str, Optional[bytes]],
                      key_for: Callable[[RequestStart], Optional[bytes]]) -> Callable[[], None]:
    """Keep a per-request key registry (the seed's, :func:`shmsteer.keyregistry.get_shared_registry`)
    in step with vLLM's requests, keyed by the id workers see.

    When a request starts, ``registry[request_id] = key_for(start)`` (nothing when it returns
    None); when it ends, ``registry[request_id] = None``: revoked, so a worker's step still in
    flight reads the sentinel, never a missing key; shmsteer's registry purges the sentinel after
    its grace period (60 s). Returns the function that unbinds (:func:`on_request`'s).

    Example, in the API server process (the seed's alternative entrypoint)::

        manager = keyregistry.registry_manager_main_process(); next(manager)
        bind_key_registry(keyregistry.get_shared_registry(), lambda r: derive_key(r.external_id))
        # then start vLLM's server in this process; a worker reads
        # keyregistry.get_shared_registry()[req_id] for the req_ids of its batch
    """
    def start(req: RequestStart) -> None:
        key = key_for(req)
        if key is not None:
            registry[req.request_id] = key

    def end(request_id: str) -> None:
        if request_id in registry:
            registry[request_id] = None

    return on_request(start, end)
