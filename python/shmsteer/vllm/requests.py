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
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from ..openai import SteeringRequestError, admission_from_request

__all__ = ["STRUCTURED_FIELDS", "STRING_FIELDS", "steering_body", "admission_for", "Admissions"]

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
