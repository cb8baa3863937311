"""The engine side of the vLLM plugin: the owner, admissions and the frontend's checks.

Where the owner lives: in vLLM's engine-core process, beside the scheduler (``SHMSTEER_VLLM_OWNER``
unset or ``engine``). The scheduler is the one place that sees, in one process and in order, a
request's internal id (the id workers see: vLLM appends a random suffix to the client's id), its
``SamplingParams.extra_args``, its prompt length, and its end (finished, aborted, or preempted for
good), all before any step that includes it is handed to a worker. Admitting there needs no id
mapping, no network hop per request, and cannot race the first step: ``Scheduler.add_request``
admits synchronously, and every later ``schedule()`` (hence every worker's step) sees the
admission. The owner is a :class:`shmsteer.Owner` created when the scheduler is built, sized from
the model's config (hidden size, layers), in namespace ``SHMSTEER_NAMESPACE`` (``-dp<rank>``
appended under data parallelism: one engine core, one owner) with the secret of
``SHMSTEER_SECRET`` / ``SHMSTEER_SECRET_FILE``. Other processes reach it as any owner: a
:class:`shmsteer.Client` registers named vectors and sets global tiers.

The owner declares the capture consumers of ``SHMSTEER_VLLM_CAPTURE`` and, with
``SHMSTEER_VLLM_CAPTURE_DIR``, runs the filesystem consumer here (:mod:`shmsteer.vllm.capture`).

``SHMSTEER_VLLM_OWNER=external``: an owner runs elsewhere (``shmsteer serve``); workers attach to
it and global tiers, named vectors and latches steer, but per-request fields cannot be admitted
from here yet (such a request fails with an error).

What is patched, in the process that runs it (each patch installs once):

* ``InputProcessor._validate_params`` (the API server / ``LLM`` process): the fork's request checks
  (:func:`~shmsteer.vllm.requests.admission_for` against the model's width and layers), so a
  refused body is a ``ValueError``, which vLLM's OpenAI server answers with a 400 and its text
  (``LLM.generate`` raises it). Then :func:`check_named_refs`, at the owner's current version
  (the process reads the owner's region, through a :class:`shmsteer.Client` when the owner lives
  in another process): the request's gates through the owner's own resolution
  (:func:`shmsteer.check_gates` with ``at``, ``shmsteer_gates_check_at``), so a gate the owner
  would refuse, for its form (``BadGateError``, ``GateUnsupportedError``, ...) or for its vectors
  and model (a vector a gate names that the owner does not have, ``UnknownVectorError``; an
  inline probe not at one site, ``ProbeSiteError``; an inline gate vector whose hook, layer or
  width does not fit, ``UnknownHookError``, ``LayerRangeError``, ``HiddenSizeError``), is a 400
  with the engine's text (less the ``request "<id>": `` an admission names, an id not known
  yet); and a ``steering_name`` naming no registered vector, with the fork's "Unknown steering
  module" text. When no owner can be read from here, only the gates' form is checked
  (:func:`shmsteer.check_gates`).
* ``Scheduler.schedule``: the region version the step's ranks steer at, as
  ``SchedulerOutput.shmsteer_version`` (it travels with the batch to every tensor-parallel rank),
  kept pinned for the last :data:`PINNED_STEPS` steps so no rank finds it reclaimed.
* ``Scheduler.__init__``: the owner. ``Scheduler.add_request``: the admission; a refusal the
  frontend could not see (a named vector, or a vector a gate names, removed since the
  frontend's check; the bound of the request's steering and gates together, which needs the
  owner's latches; anything the owner refuses when the frontend could not read its region)
  finishes that request with ``FINISHED_ERROR`` at the next step's output (it may have run that
  one step unsteered), never the engine. ``Scheduler._free_request``: the end.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Tuple

from ..errors import ShmsteerError
from ..gates import check_gates
from ..openai import DEFAULT_HOOKS, SteeringRequestError
from .errors import PluginConfigError
from .requests import Admissions, RequestStart, admission_for, request_ended, request_started

__all__ = ["owner_mode", "namespace", "patch_frontend", "patch_scheduler", "patch_output_processor",
           "engine_admissions", "check_named_refs", "client_error"]

log = logging.getLogger("shmsteer.vllm")

_state: Dict[str, Any] = {"admissions": None, "owner": None, "frontend_client": None}


def owner_mode() -> str:
    """``engine`` (the default: the owner lives in the engine-core process) or ``external``."""
    mode = os.environ.get("SHMSTEER_VLLM_OWNER", "engine").strip().lower() or "engine"
    if mode not in ("engine", "external"):
        raise PluginConfigError(f"SHMSTEER_VLLM_OWNER={mode!r}: want engine or external")
    return mode


def namespace(dp_rank: int = 0, dp_size: int = 1) -> str:
    """The owner's namespace: ``SHMSTEER_NAMESPACE`` (default ``vllm``), ``-dp<rank>`` appended
    when the engine has several data-parallel ranks (each has its own scheduler and owner)."""
    ns = os.environ.get("SHMSTEER_NAMESPACE", "vllm")
    return f"{ns}-dp{dp_rank}" if dp_size > 1 else ns


def _model_dims(model_config: Any) -> Tuple[int, int]:
    hf = model_config.hf_text_config if hasattr(model_config, "hf_text_config") else model_config.hf_config
    return int(hf.hidden_size), int(hf.num_hidden_layers)


def engine_admissions() -> Optional[Admissions]:
    """This process's admissions (None before a scheduler was built here, or when external)."""
    return _state["admissions"]


def _dp(vllm_config: Any) -> Tuple[int, int]:
    pc = vllm_config.parallel_config
    return int(getattr(pc, "data_parallel_rank", 0) or 0), int(getattr(pc, "data_parallel_size", 1) or 1)


_client_errors: Dict[type, type] = {}


def client_error(err: Exception) -> Exception:
    """``err`` (a ``ValueError``, or the owner's ``LookupError`` for an unknown vector) as a
    refusal vLLM's OpenAI server answers with a 400 and ``str(err)``: an instance of a subclass
    of both ``type(err)`` (callers catching :class:`SteeringRequestError`, ``ValueError`` or
    ``UnknownVectorError``, as ``LLM.generate``'s, still do) and vLLM's ``VLLMValidationError``. A plain
    ``ValueError`` raised while ``AsyncLLM.generate`` takes a request is wrapped into
    ``EngineGenerateError``, a 500 without text; a ``VLLMClientError`` passes as a 400."""
    from vllm.exceptions import VLLMClientError, VLLMValidationError
    if isinstance(err, VLLMClientError):
        return err
    base = type(err)
    cls = _client_errors.get(base)
    if cls is None:
        cls = type(base.__name__, (base, VLLMValidationError), {"__module__": base.__module__,
                                                                 "__doc__": base.__doc__})
        _client_errors[base] = cls
    out = cls.__new__(cls, str(err))
    Exception.__init__(out, str(err))
    out.__dict__.update(err.__dict__)
    out.parameter, out.value = None, None
    return out


def patch_frontend() -> None:
    """Check the fork's request fields where vLLM validates ``SamplingParams`` (a 400)."""
    from vllm.v1.engine.input_processor import InputProcessor
    if getattr(InputProcessor, "_shmsteer_patched", False):
        return
    orig = InputProcessor._validate_params

    def _validate_params(self: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(self, params, *args, **kwargs)
        extra = getattr(params, "extra_args", None)
        if extra:
            hidden, layers = _model_dims(self.model_config)
            try:
                kw = admission_for(extra, 0, (hidden, layers, DEFAULT_HOOKS))
                if kw is not None:
                    check_named_refs(kw, getattr(self, "vllm_config", None))
            except SteeringRequestError as e:
                raise client_error(e) from None
            except ShmsteerError as e:  # a gate the owner refuses: BadGateError, UnknownVectorError, ...
                if not isinstance(e, _REFUSALS):
                    raise
                raise client_error(e) from None
        return out

    InputProcessor._validate_params = _validate_params
    InputProcessor._shmsteer_patched = True


def _ref_names(kw: Dict[str, Any]) -> List[str]:
    """The named vectors an admission's override references (``steering_name``), in order."""
    names: List[str] = []
    for tier in (kw.get("override") or {}).values():
        for ref in tier.get("refs", ()) if isinstance(tier, dict) else ():
            if ref.get("name") not in names:
                names.append(ref["name"])
    return names


def _frontend_reader(vllm_config: Any) -> Optional[Any]:
    """What this process reads named vectors through: the owner when it lives here (offline
    ``LLM`` with the engine in process), else a :class:`shmsteer.Client` of the owner's namespace,
    attached on first use and kept (None when no owner answers yet, or under data parallelism,
    where the engine that gets the request is not known here)."""
    adm = _state["admissions"]
    if adm is not None:
        return adm.owner
    client = _state.get("frontend_client")
    if client is not None:
        return client
    dp_rank, dp_size = _dp(vllm_config) if vllm_config is not None else (0, 1)
    if dp_size > 1:
        return None
    from ..client import Client
    from ..errors import ShmsteerError
    try:
        client = Client(namespace())
    except ShmsteerError as e:
        log.warning("shmsteer: frontend cannot attach to namespace %r to check named vectors: %s", namespace(), e)
        return None
    _state["frontend_client"] = client
    return client


_REFUSALS = (ValueError, LookupError)
"""The bases of the owner's refusals of a request (BadGateError, UnknownVectorError, ...): what
the frontend answers with a 400; any other ShmsteerError is a failure of its own."""


def _gates_refusal(snap: Any, steering: Any) -> Optional[Exception]:
    """The owner's refusal of the gates at ``snap`` (:func:`shmsteer.check_gates` with ``at``,
    ``shmsteer_gates_check_at``), returned, or None when it would admit them."""
    if steering is None:
        return None
    try:
        check_gates(steering, at=snap)
    except SteeringRequestError as e:
        return e
    except ShmsteerError as e:
        if not isinstance(e, _REFUSALS):
            raise
        return e
    return None


def check_named_refs(kw: Dict[str, Any], vllm_config: Any = None) -> None:
    """Refuse an admission the owner would refuse for what only it has: its gates
    (``kw["steering"]``) checked as the owner's admission checks them against its vectors and
    model (:func:`shmsteer.check_gates` at a snapshot: a gate naming a vector the owner does not
    have, a probe not at one site, an inline vector whose hook, layer or width does not fit),
    raising the owner's typed error with its text (``request "id": `` left out: the internal id
    is not known here); then a ``steering_name`` naming no registered vector, with the fork's
    text for an unknown steering module (a :class:`SteeringRequestError`, so vLLM answers 400):
    ``Unknown steering module 'x'. Available: ['a', 'b']`` (``none`` when nothing is registered).

    Checked in the process that validates requests, against the owner's current version; a vector
    removed between this check and the scheduler's admission fails the request there instead
    (``finish_reason`` ``error``). When no owner can be read from here only the gates' form is
    checked (:func:`shmsteer.check_gates` without a snapshot). A client whose owner left (a
    ping fails) attaches again once, so a restarted owner's vectors are the ones checked."""
    names = _ref_names(kw)
    steering = kw.get("steering")
    if not names and steering is None:
        return
    have: Optional[List[str]] = None
    refused: Optional[Exception] = None
    for attempt in (0, 1):
        reader = _frontend_reader(vllm_config)
        if reader is None:
            break
        try:
            if reader is _state.get("frontend_client"):
                # A client's snapshot of an owner that left still reads its old region (the
                # mapping outlives it): ask the owner first (OwnerGoneError: attach again).
                reader.ping()
            with reader.snapshot() as snap:
                refused = _gates_refusal(snap, steering)
                have = sorted(v["name"] for v in snap.vectors()) if names else []
            break
        except ShmsteerError as e:  # the owner restarted or left: attach again once
            if _state.get("frontend_client") is not reader or attempt == 1:
                log.warning("shmsteer: frontend cannot read the owner's vectors: %s", e)
                break
            _state["frontend_client"] = None
            reader.close()
    if refused is not None:
        raise refused
    if have is None:  # no owner read: the gates' form only, the scheduler checks the rest
        if steering is not None:
            check_gates(steering)
        return
    for name in names:
        if name not in have:
            avail = "[" + ", ".join(repr(n) for n in have) + "]" if have else "none"
            raise SteeringRequestError(f"Unknown steering module {name!r}. Available: {avail}")


def _make_owner(vllm_config: Any) -> Optional[Admissions]:
    if owner_mode() != "engine":
        return None
    if _state["admissions"] is not None:
        return _state["admissions"]
    from ..client import Owner
    from .capture import owner_capture, start_consumer
    hidden, layers = _model_dims(vllm_config.model_config)
    dp = _dp(vllm_config)
    ns = namespace(*dp)
    consumers, global_specs, capture_dir = owner_capture()
    owner = Owner(ns, hidden=hidden, layers=layers, capture_consumers=consumers, capture_global=global_specs)
    _state["owner"] = owner
    if capture_dir is not None:
        start_consumer(ns, capture_dir, *dp)  # under data parallelism: a directory per engine
    _state["admissions"] = Admissions(owner)
    log.info("shmsteer: owner of namespace %r in the engine process (hidden %d, %d layers)", ns, hidden, layers)
    return _state["admissions"]


def _fail(scheduler: Any, request_id: str) -> None:
    """Finish a request with FINISHED_ERROR through the scheduler's own error set, which the next
    ``update_from_output`` finishes with an output to its client (as a grammar that failed to
    compile); finishing it here would send the client nothing."""
    errs = getattr(scheduler, "grammar_compile_error_reqs", None)
    if isinstance(errs, set):
        errs.add(request_id)
        return
    from vllm.v1.request import RequestStatus
    scheduler.finish_requests(request_id, RequestStatus.FINISHED_ERROR)


PINNED_STEPS = 4
"""Steps whose versions the scheduler keeps pinned: a step's version cannot be reclaimed before
its ranks begin it (vLLM runs at most 2 steps ahead: its batch queue under async scheduling)."""


def _pin(scheduler: Any, owner: Any) -> int:
    """Pin the current version for a step (the last PINNED_STEPS stay pinned) and return it."""
    pins: Deque[Any] = scheduler.__dict__.setdefault("_shmsteer_pins", deque())
    snap = owner.snapshot()
    pins.append(snap)
    while len(pins) > PINNED_STEPS:
        pins.popleft().close()
    return int(snap.version)


def patch_scheduler() -> None:
    """Admit at ``add_request``, end at ``_free_request``, own the region from ``__init__``."""
    from vllm.v1.core.sched.scheduler import Scheduler
    if getattr(Scheduler, "_shmsteer_patched", False):
        return
    orig_init, orig_add, orig_free = Scheduler.__init__, Scheduler.add_request, Scheduler._free_request

    def __init__(self: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, vllm_config, *args, **kwargs)
        self._shmsteer = _make_owner(vllm_config)

    def add_request(self: Any, request: Any) -> None:
        adm: Optional[Admissions] = getattr(self, "_shmsteer", None)
        fresh = request.request_id not in self.requests
        error: Optional[str] = None
        sp = request.sampling_params
        extra = getattr(sp, "extra_args", None) if sp is not None else None
        if fresh and extra:
            if adm is None:
                if admission_for(extra, request.num_prompt_tokens) is not None:
                    error = "shmsteer: per-request steering needs the owner in the engine (SHMSTEER_VLLM_OWNER=engine)"
            else:
                try:
                    adm.admit(request.request_id, extra, request.num_prompt_tokens,
                              external_id=getattr(request, "external_req_id", None))
                except (SteeringRequestError, ValueError, LookupError) as e:
                    error = str(e)
                except Exception as e:  # the owner's typed refusals (ShmsteerError and subclasses)
                    from ..errors import ShmsteerError
                    if not isinstance(e, ShmsteerError):
                        raise
                    error = f"{type(e).__name__}: {e}"
        orig_add(self, request)
        if error is not None:
            log.warning("shmsteer: request %s refused: %s", request.request_id, error)
            _fail(self, request.request_id)

    def _free_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig_free(self, request, *args, **kwargs)
        adm: Optional[Admissions] = getattr(self, "_shmsteer", None)
        if adm is not None:
            adm.end(request.request_id)
        return out

    orig_schedule = Scheduler.schedule

    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig_schedule(self, *args, **kwargs)
        adm: Optional[Admissions] = getattr(self, "_shmsteer", None)
        if adm is not None:  # the version every rank steers this step at (it travels with the batch)
            out.shmsteer_version = _pin(self, adm.owner)
        return out

    Scheduler.__init__ = __init__
    Scheduler.add_request = add_request
    Scheduler._free_request = _free_request
    Scheduler.schedule = schedule
    Scheduler._shmsteer_patched = True


def patch_output_processor() -> None:
    """Tell :func:`shmsteer.vllm.requests.on_request`'s listeners when a request enters and leaves
    vLLM's engine, in the frontend process, under vLLM's internal id.

    ``OutputProcessor.add_request`` (AsyncLLM and LLMEngine call it with the ``EngineCoreRequest``
    after ``InputProcessor.assign_request_id`` made the internal id, before sending it to the
    engine core): a new id starts. ``_finish_request`` (the last output) and ``abort_requests``
    (the ids it removed): it ends."""
    from vllm.v1.engine.output_processor import OutputProcessor
    if getattr(OutputProcessor, "_shmsteer_patched", False):
        return
    orig_add, orig_finish, orig_abort = (OutputProcessor.add_request, OutputProcessor._finish_request,
                                         OutputProcessor.abort_requests)

    def add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        rid = request.request_id
        if rid not in self.request_states:
            sp = getattr(request, "sampling_params", None)
            extra = getattr(sp, "extra_args", None) if sp is not None else None
            try:
                request_started(RequestStart(rid, getattr(request, "external_req_id", None) or rid,
                                             dict(extra or {})))
            except ValueError as e:  # a listener's refusal: a 400, not AsyncLLM's text-less 500
                raise client_error(e) from e
        try:
            return orig_add(self, request, *args, **kwargs)
        except BaseException:
            if rid not in self.request_states:
                request_ended(rid)
            raise

    def _finish_request(self: Any, req_state: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig_finish(self, req_state, *args, **kwargs)
        request_ended(req_state.request_id)
        return out

    def abort_requests(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = set(self.request_states)
        out = orig_abort(self, *args, **kwargs)
        for rid in before - set(self.request_states):
            request_ended(rid)
        return out

    OutputProcessor.add_request = add_request
    OutputProcessor._finish_request = _finish_request
    OutputProcessor.abort_requests = abort_requests
    OutputProcessor._shmsteer_patched = True
