"""Client and Owner: a Python process's handle on a shmsteer region.

A :class:`Client` attaches to an owner (a Go program, or a Python main process running
:class:`Owner`) and reads keys and vectors straight from the shared mapping; its few writes go
to the owner as RPCs. An :class:`Owner` hosts the region in this process.

Processes must be started with the ``spawn`` start method (or fork+exec): the Go runtime inside
libshmsteer.so does not survive ``fork``, so every call in a child forked after the library was
loaded raises :class:`~shmsteer.errors.ForkedError` (at once, never a hang).
"""

from __future__ import annotations

import ctypes
import json
import math
import numbers
import os
import threading
import weakref
from ctypes import byref, c_int, c_uint32, c_uint64, c_void_p
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from . import _lib
from ._common import (I32, I64, PHASES, U32, U64, BadPhaseError, _b, _int,  # noqa: F401 (PHASES, U64: re-exported)
                      _quiet_close)
from ._lib import check, lib
from .errors import ForkedError, InvalidArgumentError
from .keys import THREAD_READERS, Keys, close_readers, new_keys  # noqa: F401 (THREAD_READERS: re-exported)
from .admission import split_clamps, split_override
from .gates import gates_for_abi
from .snapshot import ImportedVector, NamedVector, Snapshot, VectorEntry, _Lifetime
from .stepper import Effective, SpanLike, Stepper, StepperBusyError, span_fields  # noqa: F401 (re-exported)

try:  # numpy is optional: views are memoryviews without it
    import numpy as _np
except ImportError:  # pragma: no cover - exercised only where numpy is missing
    _np = None

Secret = Union[bytes, str, None]

#: Admitted.source values, by SHMSTEER_SOURCE_* code.
SOURCES = ("none", "override", "latch", "composed")


class Admitted(int):
    """What :meth:`Owner.admit` did (Go's ``steer.Admitted``). It is the region version that
    published the admission (an ``int``, as admit returned before), with:

    Attributes:
        version: that version (``int(self)``).
        source: where the request's steering came from: ``"none"`` (no request steering),
            ``"override"`` (its own), ``"latch"`` (its conversation's latch, bridged) or
            ``"composed"`` (the latch bridged, its override added).
        latched: the override was latched onto the conversation (the latch triggered).
        refused: the override was too large to latch (it still steers this request).
        replaced: the id was admitted and not ended: this admission replaced its entry (its
            steering, gates and capture). Re-admitting a live id is allowed; this says so.
        digest: sha256 of the published request entry (32 zero bytes for ``"none"``).
    """

    source: str
    latched: bool
    refused: bool
    replaced: bool
    digest: bytes

    def __new__(cls, version: int, source: str = "none", latched: bool = False, refused: bool = False,
                replaced: bool = False, digest: bytes = bytes(32)) -> "Admitted":
        self = super().__new__(cls, version)
        self.source, self.latched, self.refused, self.replaced, self.digest = source, latched, refused, replaced, digest
        return self

    @property
    def version(self) -> int:
        return int(self)

    @property
    def bridged(self) -> bool:
        """The conversation's latch steers this request (source latch or composed)."""
        return self.source in ("latch", "composed")

    def __repr__(self) -> str:
        return (f"Admitted(version={int(self)}, source={self.source!r}, latched={self.latched}, "
                f"refused={self.refused}, replaced={self.replaced})")


def _ms(what: str, seconds: float) -> int:
    """Seconds as whole milliseconds (at least 1) for an int64 field."""
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) or not math.isfinite(seconds) \
            or seconds <= 0 or seconds * 1000 > I64[1]:
        raise InvalidArgumentError(f"shmsteer: invalid argument: {what} {seconds!r} must be a positive "
                                   "finite number of seconds")
    return max(1, int(seconds * 1000))


def _secret_args(secret: Secret, secret_file: Optional[str]) -> Tuple[Optional[bytes], int, Optional[bytes]]:
    # Both given reach the library as both: SecretConflictError, as in Go.
    sb = _b(secret) if secret is not None else None
    return sb, (len(sb) if sb is not None else 0), (os.fsencode(secret_file) if secret_file is not None else None)


def _close_handle(life: _Lifetime, readers: Set[int]) -> None:
    """A handle's finalizer: its thread readers first (they must not outlive its mapping), then
    the handle, at once or once the last snapshot view is gone."""
    close_readers(readers)
    try:
        life.close()
    except Exception:  # pragma: no cover - finalizers must not raise
        pass


class _Handle:
    """What Client and Owner share: keys, snapshots, steppers, status."""

    _h: Optional[int]

    def __init__(self, handle: int, owner: bool) -> None:
        self._h = handle
        self._is_owner = owner
        self._life = _Lifetime(handle)  # when the C handle closes: after the last view
        self._reader_handles: Set[int] = set()  # the keys' open thread readers (shmsteer.keys)
        self._final = weakref.finalize(self, _close_handle, self._life, self._reader_handles)
        self._model: Optional[Tuple[int, int, List[str]]] = None
        self.keys: Keys = new_keys(self)

    @property
    def handle(self) -> int:
        """The raw C handle (shmsteer_t*); raises ClosedError after close()."""
        if self._h is None:
            from .errors import ClosedError
            raise ClosedError("shmsteer: closed")
        return self._h

    @property
    def is_owner(self) -> bool:
        return self._is_owner

    def close(self) -> None:
        """Detach (client) or stop serving (owner). Idempotent; never blocks on live views.

        Every call through this handle raises ClosedError afterwards. Snapshots still open and
        vector views still alive keep the mapping: the library handle is closed when the last of
        them is gone (garbage collected), so a view never reads unmapped memory and close
        neither waits for it nor raises BusyError. An owner stops serving only then."""
        if self._h is None:
            return
        self._h = None
        self._final.detach()
        close_readers(self._reader_handles)
        self._life.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def ping(self) -> None:
        """Raise OwnerGoneError if the owner is gone (no-op in the owner)."""
        check(lib.shmsteer_ping(self.handle))

    @property
    def version(self) -> int:
        """The last published region version (what a scheduler hands to every rank)."""
        v = c_uint64()
        check(lib.shmsteer_version(self.handle, byref(v)))
        return v.value

    def status(self) -> Dict[str, Any]:
        """Owner, model, steering and region counters as a dict."""
        return json.loads(_lib.read_json(lib.shmsteer_status_json, self.handle))

    @property
    def model(self) -> Tuple[int, int, List[str]]:
        """(hidden size, layers, hook names) recorded in the region."""
        if self._model is None:
            m = self.status()["model"]
            self._model = (m["hidden"], m["layers"], list(m["hooks"]))
        return self._model

    def hook_id(self, hook: Union[str, int]) -> int:
        """The id of a hook name (ints pass through)."""
        if not isinstance(hook, (str, bytes)):
            return _int("hook id", hook, U32)
        out = c_uint32()
        check(lib.shmsteer_hook_id(self.handle, _b(hook), byref(out)))
        return out.value

    def snapshot(self, version: int = 0) -> "Snapshot":
        """Pin ``version`` (0: the current one); use as a context manager."""
        return Snapshot(self, version)

    def stepper(self, strict: bool = False) -> "Stepper":
        """A per-thread steering stepper (steer.Stepper). ``strict``: a span naming a request
        with no admitted entry (never admitted, ended, mistyped) raises
        :class:`~shmsteer.errors.UnknownRequestError` instead of getting the global steering
        only (see :attr:`Stepper.strict`)."""
        st = Stepper(self)
        if strict:
            st.strict = True
        return st

    def register_vector(self, name: str, entries: Sequence[Tuple[Union[str, int], int, float, Any]],
                        kind: str = "steer") -> int:
        """Register (or replace) named vector ``name`` from (hook, layer, scale, float32 data)
        entries; a client sends it to the owner. Returns the region version that wrote it.

        ``kind`` is the fork's namespace: ``"steer"`` (added to hidden states through
        references) or ``"probe"`` (read by gates; exactly one entry, else
        :class:`~shmsteer.errors.ProbeSiteError`). A probe and a steering vector may share a
        name."""
        register = _kind_call(kind, lib.shmsteer_vector_register, lib.shmsteer_probe_register)
        arr = (_lib.VectorEntry * len(entries))()
        keep = []
        for i, (hook, layer, scale, data) in enumerate(entries):
            ptr, n, owner = _float_ptr(data)
            keep.append(owner)
            arr[i] = _lib.VectorEntry(self.hook_id(hook), _int(f"entry {i} layer", layer, I32), scale,
                                      ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), n)
        v = c_uint64()
        nb = _b(name)
        check(register(self.handle, nb, len(nb), arr, len(entries), byref(v)))
        del keep
        return v.value

    def import_vector(self, name: str, path: Union[str, "os.PathLike[str]"], scale: float = 1.0,
                      layers: Union[None, str, int, Tuple[int, int]] = None, hook: Optional[str] = None,
                      format: Optional[str] = None, max_bytes: int = 0,
                      model_hint: Optional[str] = None) -> "ImportedVector":
        """Register (or replace) named vector ``name`` from a vector file.

        A llama.cpp GGUF control vector, .npy, .npz or safetensors file is read by the Go
        importer (steer/vecfile, through ``shmsteer_vector_import``). A PyTorch ``.pt``/``.pth``
        file (or ``format="pt"``) is unpickled here with ``torch.load(weights_only=True)`` only
        and its tensors go to the same importer as bytes (:func:`shmsteer.vectors.pt_to_bytes`,
        ``shmsteer_vector_import_bytes``). Either way every rule is the importer's. In a client
        the file is read here and the vectors are sent to the owner.

        Args:
            scale: multiplies every value, as llama.cpp's ``--control-vector-scaled``.
            layers: keep layers A..B inclusive (``"A-B"``, ``(A, B)`` or ``A``), as
                ``--control-vector-layer-range``; required for a single ``[hidden]`` array.
            hook: the hook GGUF directions, plain arrays and ``layers.N`` tensors steer
                (None: post_block, the block output llama.cpp steers).
            format: "gguf", "npy", "npz", "safetensors" or "pt" (None: magic bytes, then the
                extension).
            max_bytes: size cap, checked before the file is read (0: the importer's default);
                for a .pt file it caps the tensors' bytes, after torch.load.
            model_hint: the model hint stored with the vector (None: a GGUF file's
                ``controlvector.model_hint``, none for other formats; ``""``: none); at most
                256 bytes of printable UTF-8, else :class:`~shmsteer.errors.BadModelHintError`.

        Returns:
            the region version that wrote it, the digest of its encoding and the model hint
            stored with it (read at a snapshot right after the import).

        Raises:
            the ValueError subclasses of :class:`~shmsteer.errors.VectorFileError` and steer's
            (HiddenSizeError, LayerRangeError, NonFiniteError, ...), naming the file, the tensor
            and the expected shape; OSError when the file cannot be read.
        """
        from . import vectors
        if not math.isfinite(scale):  # JSON cannot carry it
            from .errors import VectorFileOptionsError
            raise VectorFileOptionsError(f"shmsteer: bad vector file options: scale {scale}: want a finite "
                                         "non-zero number")
        opts: Dict[str, Any] = {}
        if scale != 1:
            opts["scale"] = scale
        if layers is not None:
            # The importer parses and checks the range; a pair or an int is only spelled out.
            opts["layers"] = layers if isinstance(layers, str) else (
                str(layers) if isinstance(layers, int) else "-".join(str(x) for x in layers))
        if hook is not None:
            opts["hook"] = hook
        if max_bytes:
            opts["max_bytes"] = max_bytes
        if model_hint is not None:
            opts["model_hint"] = model_hint
        os.stat(path)  # a missing file is FileNotFoundError, not the library's generic OtherError
        v = c_uint64()
        digest_buf = (ctypes.c_uint8 * 32)()
        nb = _b(name)
        if vectors.is_pt(path, format):
            data, opts["format"] = vectors.pt_to_bytes(path)
            js = json.dumps(opts).encode()
            check(lib.shmsteer_vector_import_bytes(self.handle, nb, len(nb), data, len(data), os.fsencode(path),
                                                   js, len(js), byref(v), digest_buf))
            return self._imported(name, v.value, bytes(digest_buf))
        if format is not None:
            opts["format"] = format
        js = json.dumps(opts).encode() if opts else b""
        check(lib.shmsteer_vector_import(self.handle, nb, len(nb), os.fsencode(path), js, len(js), byref(v),
                                         digest_buf))
        return self._imported(name, v.value, bytes(digest_buf))

    def _imported(self, name: str, version: int, digest: bytes) -> "ImportedVector":
        with self.snapshot() as snap:
            return ImportedVector(name, version, digest, snap.model_hint(name))

    def export_vector(self, name: str, path: Union[str, "os.PathLike[str]"], format: Optional[str] = None,
                      model_hint: Optional[str] = None) -> None:
        """Write named vector ``name`` (read at the current version, pinned while it is written)
        to ``path`` as "gguf", "npy", "npz", "safetensors" (by the Go exporter) or "pt" (a
        ``torch.save`` dict ``{"<hook>.<layer>": tensor}``, :func:`shmsteer.vectors.save_pt`);
        None: by the extension. Importing the file gives back the same floats bitwise. GGUF
        holds only post_block at layers >= 1, npy one hook:
        :class:`~shmsteer.errors.UnrepresentableError` otherwise. A GGUF file's
        ``controlvector.model_hint`` is ``model_hint``, or the hint stored with the vector when
        None (``""`` writes none); a bad hint is :class:`~shmsteer.errors.BadModelHintError`."""
        from . import vectors
        if vectors.is_pt(path, format):
            with self.snapshot() as snap:
                nv = snap.vector(name)
                vectors.save_pt(path, [(e.hook, e.layer, e.scale, e.data) for e in nv.entries])
                del nv  # drop the views so the pin ends with the snapshot
            return
        nb = _b(name)
        if model_hint is not None and not isinstance(model_hint, str):
            raise TypeError(f"model_hint must be a str or None, not {type(model_hint).__name__}")
        hint = model_hint.encode("utf-8", "surrogatepass") if model_hint is not None else None
        if hint is not None and b"\0" in hint:
            from .errors import BadModelHintError
            raise BadModelHintError(f"shmsteer: bad model hint: {model_hint!r} has the non-printable character U+0000")
        check(lib.shmsteer_vector_export(self.handle, nb, len(nb), os.fsencode(path),
                                         format.encode() if format else None, hint))

    def set_global(self, steering: Dict[str, Any]) -> int:
        """Replace the global steering (steering JSON of shmsteer.h as a dict; ``{}`` clears).

        In a worker the owner does the write (a Go or a Python owner alike) and validates it
        again; returns the region version of the write.
        """
        js = json.dumps(steering).encode()
        v = c_uint64()
        check(lib.shmsteer_global_set_json(self.handle, js, len(js), byref(v)))
        return v.value

    def unregister_vector(self, name: str, kind: str = "steer") -> int:
        """Delete a named vector of ``kind`` (``"steer"`` or ``"probe"``); returns the region
        version that deleted it."""
        unregister = _kind_call(kind, lib.shmsteer_vector_unregister, lib.shmsteer_probe_unregister)
        v = c_uint64()
        nb = _b(name)
        check(unregister(self.handle, nb, len(nb), byref(v)))
        return v.value


def _kind_call(kind: str, steer_fn: Any, probe_fn: Any) -> Any:
    """The C call for a named vector of ``kind``; ValueError for any other kind."""
    if kind == "steer":
        return steer_fn
    if kind == "probe":
        return probe_fn
    raise ValueError(f"kind must be one of ('probe', 'steer'), got {kind!r}")


class Client(_Handle):
    """A worker process attached to an owner.

    Attributes:
        keys: the per-request key registry (:class:`Keys`): ``client.keys[request_id]`` is the
            key's bytes (KeyRevokedError, KeyNotFoundError), ``keys[id] = b"..."`` sets one
            through the owner, ``keys.revoke(id)`` revokes it.

    Steering: :meth:`snapshot` pins a version (``snap.vector(name)`` is a :class:`NamedVector`
    whose ``entries[i].data`` are read-only numpy views of the mapping), :meth:`stepper`
    applies a step's steering, ``import_vector``/``export_vector`` read and write vector files.

    Args:
        namespace: must match the owner's.
        secret: the shared secret; with neither it nor ``secret_file``, ``$SHMSTEER_SECRET`` or
            the file ``$SHMSTEER_SECRET_FILE`` names (both set: SecretConflictError).
        secret_file: a file holding the secret (one trailing ``\\n`` or ``\\r\\n`` ignored, as Go's
            ``ipc.SecretFromFile`` reads it); giving both is SecretConflictError.
        timeout: seconds bounding the attach and each RPC (None: 5 s).

    Raises:
        AuthSecretNotDefinedError, NotYetInitializedError, AuthFailedError, ForkedError.
    """

    def __init__(self, namespace: str = "", secret: Secret = None, secret_file: Optional[str] = None,
                 timeout: Optional[float] = None) -> None:
        sb, sl, sf = _secret_args(secret, secret_file)
        out = c_void_p()
        ms = 0 if timeout is None else _ms("timeout", timeout)
        check(lib.shmsteer_attach(_b(namespace), sb, sl, sf, ms, byref(out)))
        super().__init__(out.value, owner=False)


class Follower:
    """A worker that follows the owner of its namespace across owner restarts (Go's
    ``ipc.Follower``, through ``shmsteer_follow``).

    When the owner dies, :attr:`client` keeps reading its last region (:attr:`dead` is True)
    while the follower re-attaches with backoff; with ``ready="serve"`` it switches to a
    restarted ``shmsteer serve`` only once that has restored its persisted state, so a worker
    never steps with an empty region. Take :meth:`current` (or :attr:`client`) once per unit of
    work (a step) and use that client throughout; a replaced client stays usable for 10 s.

    Args:
        namespace, secret, secret_file, timeout: as for :class:`Client`; with ``ready="serve"``
            the first attach too waits up to ``timeout`` for a ready region.
        ready: None (switch as soon as attached: any owner) or ``"serve"`` (the owner is
            ``shmsteer serve``: wait for its state).
        poll: seconds between checks of the owner (0.1).

    Raises:
        as :class:`Client`; OwnerTimeoutError if no ready region came within ``timeout``.
    """

    def __init__(self, namespace: str = "", secret: Secret = None, secret_file: Optional[str] = None, *,
                 timeout: Optional[float] = None, ready: Optional[str] = None, poll: float = 0.1) -> None:
        if ready not in (None, "serve"):
            raise InvalidArgumentError(f"shmsteer: invalid argument: ready {ready!r}: want None or \"serve\"")
        sb, sl, sf = _secret_args(secret, secret_file)
        ms = 0 if timeout is None else _ms("timeout", timeout)
        out = c_void_p()
        check(lib.shmsteer_follow(_b(namespace), sb, sl, sf, ms, _ms("poll", poll),
                                  _lib.FOLLOW_READY_SERVE if ready == "serve" else 0, byref(out)))
        self._h: Optional[int] = out.value
        self._final = weakref.finalize(self, _quiet_close, lib.shmsteer_follower_close, out.value)
        self._clients: Dict[int, _FollowedClient] = {}
        self._lock = threading.Lock()

    def current(self) -> Tuple["Client", int, bool]:
        """(client, generation, dead): the current client, its generation (1 for the first
        attach, +1 at each re-attach) and whether its owner is known to be gone."""
        if self._h is None:
            from .errors import ClosedError
            raise ClosedError("shmsteer: follower closed")
        c, g, d = c_void_p(), c_uint64(), c_int()
        check(lib.shmsteer_follower_client(self._h, byref(c), byref(g), byref(d)))
        with self._lock:
            cl = self._clients.get(c.value)
            if cl is None:
                cl = self._clients[c.value] = _FollowedClient(c.value, self)
        return cl, g.value, bool(d.value)

    @property
    def client(self) -> "Client":
        """The current client (see :meth:`current`)."""
        return self.current()[0]

    @property
    def generation(self) -> int:
        return self.current()[1]

    @property
    def dead(self) -> bool:
        """True while reads come from a dead owner's region."""
        return self.current()[2]

    def close(self) -> None:
        """Stop following and close every client handed out. Idempotent."""
        if self._h is None:
            return
        h, self._h = self._h, None
        for cl in self._clients.values():
            cl._h = None
            close_readers(cl._reader_handles)
        self._clients.clear()
        self._final.detach()
        check(lib.shmsteer_follower_close(h))

    def __enter__(self) -> "Follower":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _FollowedClient(Client):
    """A client a :class:`Follower` handed out: the follower owns and closes its handle."""

    def __init__(self, handle: int, follower: Follower) -> None:  # noqa: D107 - no attach here
        _Handle.__init__(self, handle, owner=False)
        self._final.detach()
        self._follower = follower

    def close(self) -> None:
        """A no-op: the follower closes its clients (Follower.close)."""


class Owner(_Handle):
    """The region's owner, hosted in this (main) process: it serves workers' attaches and
    writes on Go threads of its own, whatever Python does meanwhile.

    Attributes:
        keys: the per-request key registry (:class:`Keys`), as on :class:`Client`; the owner
            writes it directly (``owner.keys[request_id] = key``, ``owner.keys.revoke(id)``;
            the revoked sentinel is purged after ``grace``).

    Args:
        namespace, secret, secret_file: as for :class:`Client`.
        hidden, layers, hooks: the model steered (hooks None: the five default hooks).
        grace: seconds a removed key's revoked sentinel stands before it is purged (60).
        index_slots, arena_bytes, reader_slots, max_key_bytes: region sizes (0: defaults).
        capture_consumers: the activation-capture consumers admissions may name, ``{name:
            type}`` (type ``"filesystem"``; serve's ``--capture-consumer NAME=TYPE``); None or
            empty: no capture is served (:func:`shmsteer.capture.serve_capture` can still
            declare them later).
        capture_global: declared consumers' global specs, ``{name: spec}`` (serve's
            ``--capture-global``; see :func:`shmsteer.capture.serve_capture`).

    Raises:
        PreviouslyInitializedError if an owner already serves this secret and namespace;
        for a bad capture declaration CaptureConsumerTypeError (an unknown type) or
        CaptureConsumerNameError (a bad name), for a bad global spec the typed error a
        request's spec gets (CaptureSpecError, CaptureHookError, ...), ValueError for
        ``capture_global`` without ``capture_consumers``: the owner is stopped again (the
        namespace is free), nothing is served.
    """

    def __init__(self, namespace: str = "", secret: Secret = None, secret_file: Optional[str] = None, *,
                 hidden: int = 1, layers: int = 1, hooks: Optional[Sequence[str]] = None,
                 grace: float = 60.0, index_slots: int = 0, arena_bytes: int = 0,
                 reader_slots: int = 0, max_key_bytes: int = 0,
                 capture_consumers: Optional[Mapping[str, str]] = None,
                 capture_global: Optional[Mapping[str, Any]] = None) -> None:
        if capture_global and not capture_consumers:
            raise ValueError("capture_global names consumers: declare them in capture_consumers")
        sb, sl, sf = _secret_args(secret, secret_file)
        cfg = _lib.OwnerConfig(_int("hidden", hidden, I32), _int("layers", layers, I32),
                               (",".join(hooks).encode() if hooks else None),
                               _int("index_slots", index_slots, I64), _int("arena_bytes", arena_bytes, I64),
                               _int("reader_slots", reader_slots, I64), _ms("grace", grace),
                               _int("max_key_bytes", max_key_bytes, I64))
        out = c_void_p()
        check(lib.shmsteer_owner_start(_b(namespace), sb, sl, sf, byref(cfg), byref(out)))
        super().__init__(out.value, owner=True)
        self._hook_index: Optional[Dict[str, int]] = None
        if capture_consumers:
            from .capture import serve_capture  # numpy: only an owner that serves capture needs it
            try:
                serve_capture(self, dict(capture_consumers), dict(capture_global or {}))
            except BaseException:
                self.close()
                raise

    def admit(self, request_id: str, override: Optional[Dict[str, Any]] = None,
              tenant: str = "", conversation: str = "",
              steering: Optional[Sequence[Dict[str, Any]]] = None,
              capture: Optional[Dict[str, Any]] = None, prompt_len: int = 0) -> Admitted:
        """Admit a request with its own steering and/or its conversation's latch; returns an
        :class:`Admitted` (the version, an ``int`` as before, with what the admission did:
        ``source``, ``latched``, ``refused``, ``replaced``). Re-admitting an id that is admitted
        and not ended replaces its entry and says so (``replaced``).

        ``steering`` is the vLLM fork's declarative gates, JSON-shaped dicts ``{"when": ...,
        "scope": ..., "apply": ...}`` (sources ``{"kind": "name", "name": n}`` or ``{"kind":
        "inline", "packed": {hook: SteeringHookPacked}}``). Refusals raise
        :class:`~shmsteer.errors.BadGateError`, :class:`~shmsteer.errors.GateUnsupportedError`,
        :class:`~shmsteer.errors.NonFiniteError`, :class:`~shmsteer.errors.UnknownVectorError` or
        :class:`~shmsteer.errors.ProbeSiteError` (a packed blob that does not decode:
        :class:`~shmsteer.openai.SteeringRequestError`), and admit nothing.

        ``override`` is the steering JSON's shape as a dict (``{"base"|"prefill"|"decode":
        {"vectors": [...], "refs": [...], "clamps": [...]}, "compose": n}``). A vector's ``data``
        may be a float list, or a numpy array or torch tensor (1-D, the hidden size; float32
        contiguous CPU memory is read in place, anything else converted): those go to the engine
        by address (:mod:`shmsteer.admission`), not as JSON; so do a tier's clamps (``{"hook",
        "layer", "dir", "min", "max", "strength"}``, ``dir`` a float list or a buffer). A bad shape or dtype raises
        :class:`~shmsteer.errors.InvalidArgumentError`, a wrong length
        :class:`~shmsteer.errors.HiddenSizeError`.

        ``capture`` is the request's activation capture, ``{consumer: spec}`` (the filesystem
        consumer's spec: the fork's FilesystemCaptureRequest dict), naming consumers this owner
        serves (:func:`shmsteer.capture.serve_capture`); ``prompt_len`` is the prompt's length in
        tokens, which its position selectors resolve against. Refusals:
        :class:`~shmsteer.errors.CaptureConsumerError` (a consumer not declared),
        :class:`~shmsteer.errors.CaptureSpecError`, ``CaptureLayerRangeError``,
        ``CaptureHookError``, ``CapturePositionRangeError`` and the other capture errors; nothing
        is admitted then.
        """
        a: Dict[str, Any] = {"tenant": tenant, "conversation": conversation}
        if capture is not None:
            a["capture"] = capture
        if prompt_len:
            a["prompt_len"] = _int("prompt_len", prompt_len, I32)
        vecs: Optional[ctypes.Array] = None
        clamps: Optional[ctypes.Array] = None
        if override is not None:
            hook_id, hidden = self._hook_ids(), self.model[0]
            a["override"], vecs, keep = split_override(override, hook_id, hidden)
            a["override"], clamps, keep_dirs = split_clamps(a["override"], hook_id, hidden)
        if steering is not None:
            a["steering"] = gates_for_abi(steering)
        js = json.dumps(a).encode()
        rid = _b(request_id)
        out = _lib.AdmittedC()
        if clamps is not None:
            check(lib.shmsteer_request_admit_buffers(self.handle, rid, len(rid), js, len(js), vecs,
                                                     0 if vecs is None else len(vecs), clamps, len(clamps),
                                                     byref(out)))
            del keep, keep_dirs  # the engine copied the floats
        elif vecs is not None:
            check(lib.shmsteer_request_admit_binary(self.handle, rid, len(rid), js, len(js), vecs, len(vecs),
                                                    byref(out)))
            del keep  # the engine copied the floats
        else:
            check(lib.shmsteer_request_admit_result(self.handle, rid, len(rid), js, len(js), byref(out)))
        src = SOURCES[out.source] if 0 <= out.source < len(SOURCES) else str(out.source)
        return Admitted(out.version, src, bool(out.latched), bool(out.refused), bool(out.replaced), bytes(out.digest))

    def _hook_ids(self) -> Callable[[Union[str, int]], int]:
        """A hook's id by name from the model's hook list (read once), or by the library (which
        raises UnknownHookError) for a name not in it or an id."""
        if self._hook_index is None:
            self._hook_index = {n: i for i, n in enumerate(self.model[2])}
        index = self._hook_index

        def hook_id(hook: Union[str, int]) -> int:
            i = index.get(hook) if isinstance(hook, str) else None
            return self.hook_id(hook) if i is None else i
        return hook_id

    def end(self, request_id: str) -> int:
        """End a request: its steering entry is removed."""
        rid = _b(request_id)
        v = c_uint64()
        check(lib.shmsteer_request_end(self.handle, rid, len(rid), byref(v)))
        return v.value

    def capture_result(self, request_id: str) -> Dict[str, Dict[str, Any]]:
        """Every declared capture consumer's result for a request (see
        :func:`shmsteer.capture.capture_result`): ``{consumer: {"status", "error", "payload"}}``.

        Raises:
            NoHubError if this owner serves no capture consumers.
        """
        from .capture import capture_result
        return capture_result(self, request_id)


def _float_ptr(data: Any) -> Tuple[int, int, Any]:
    """(address, number of floats, object keeping the memory alive) of float32 data."""
    if _np is not None:
        a = _np.ascontiguousarray(data, dtype=_np.float32)
        return a.ctypes.data, a.size, a
    arr = (ctypes.c_float * len(data))(*data)
    return ctypes.addressof(arr), len(data), arr


__all__ = ["Client", "Follower", "Owner", "Keys", "Snapshot", "NamedVector", "ImportedVector", "VectorEntry",
           "Stepper", "StepperBusyError", "Effective", "ForkedError", "Admitted", "BadPhaseError"]
