"""Drop-in replacement for the seed's shared key registry (``registry`` of Stained Glass Output
Protection), backed by a shmsteer region instead of a SyncManager and a DictProxy.

Code written for the seed's module runs unchanged:

* :func:`registry_manager_main_process` starts the registry in the main process (a generator:
  keep what it returns in a variable; the registry stops when it is closed or collected). It
  also works as a context manager.
* :func:`get_shared_registry` returns a mapping ``request id -> bytes | None`` in any process
  (main or spawned child); None is the revoked sentinel.
* ``await remove_key(request_id, registry)`` marks the key revoked (readers get None, so
  generation steps in flight do not crash) and the entry is purged 60 s later. Like the
  seed's, the coroutine returns only after those 60 s (``PURGE_DELAY_SECONDS``): to go on at
  once, run it as a task, ``asyncio.create_task(remove_key(request_id, registry))`` (keep a
  reference to the task); the owner purges the sentinel on time whether or not it completes.
* The three exceptions are :class:`RuntimeError` subclasses, as in the seed.

Deliberate differences from the seed's ``DictProxy`` (each in the direction of the seed's
intent: a revoked key must read as revoked, never as missing, while steps are in flight):

* ``del registry[k]``, like ``registry[k] = None``, revokes: the id reads None until the owner
  purges it after ``PURGE_DELAY_SECONDS``, not KeyError at once. In the owner's view the id
  stays counted by ``len``, listed by iteration and ``in`` until the purge (a worker's view
  lists live keys only: revoked ids are stored hashed, only the owner knows them).
* ``popitem()`` revokes a live key and returns it; with no live key it raises KeyError even
  while revoked ids are still counted. ``clear()`` revokes every live key at once and returns
  (MutableMapping's would spin until the purges).
* Values are bytes-like only (``bytes``, ``bytearray``, ``memoryview``; read back as
  ``bytes``): ``registry[k] = 123`` or a str raises TypeError (a DictProxy pickles anything;
  ``bytes(123)`` would be 123 zero bytes). ``registry[k] = None`` for an unknown id stores a
  revoked sentinel, as the seed's proxy stores None.
* Reads are plain loads from shared memory (no round trip, no pickling); ``copy()`` is a
  snapshot dict, as DictProxy's.
* The purge is done by the owner itself, so it happens even if ``remove_key`` is cancelled,
  and setting the id again cancels it.
* Children must be started with the ``spawn`` start method (a forked child raises
  :class:`shmsteer.errors.ForkedError`).

The secret comes from ``$SHMSTEER_SECRET`` (``KEY_REGISTRY_AUTHKEY_ENV``); the namespace from
``$SHMSTEER_KEY_REGISTRY_NAMESPACE`` (default ``"key-registry"``).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Generator, MutableMapping
from typing import Any, Iterator, Optional

from . import errors
from .client import Client, Owner, _Handle

KEY_REGISTRY_AUTHKEY_ENV = "SHMSTEER_SECRET"
KEY_REGISTRY_NAMESPACE_ENV = "SHMSTEER_KEY_REGISTRY_NAMESPACE"
DEFAULT_NAMESPACE = "key-registry"
#: Seconds a removed key's sentinel stands before it is purged (the seed's 60 s). Read when the
#: manager starts.
PURGE_DELAY_SECONDS: float = 60.0


class KeyRegistryAuthSecretNotDefinedError(RuntimeError):
    """The key registry auth secret has not been defined."""


class KeyRegistryNotYetInitializedError(RuntimeError):
    """The key registry has not yet been initialized."""


class KeyRegistryPreviouslyInitializedError(RuntimeError):
    """The key registry was previously initialized."""


_lock = threading.Lock()
_owner: Optional[Owner] = None
_client: Optional[Client] = None
_client_pid = 0


def _secret() -> bytes:
    v = os.environ.get(KEY_REGISTRY_AUTHKEY_ENV)
    if not v:
        raise KeyRegistryAuthSecretNotDefinedError(
            f"the key registry auth secret is not defined: set {KEY_REGISTRY_AUTHKEY_ENV} (the same "
            "value in the main process and every worker)")
    return v.encode()


def _namespace() -> str:
    return os.environ.get(KEY_REGISTRY_NAMESPACE_ENV, DEFAULT_NAMESPACE)


class SharedKeyRegistry(MutableMapping):
    """``request id -> bytes | None`` over the shared region (what the seed's DictProxy was).

    ``registry[id]`` is the key, None for a revoked key (until it is purged), KeyError if
    missing; ``registry[id] = None`` revokes; ``del registry[id]`` revokes too (the owner
    purges it after the grace period). Where this differs from a DictProxy (``len`` and
    iteration counting revoked ids in the owner until their purge, ``popitem``, ``clear``,
    bytes-only values) is listed in the module's docstring, "Deliberate differences".
    """

    def __init__(self, handle: _Handle) -> None:
        self._handle = handle
        self._keys = handle.keys

    def __getitem__(self, request_id: str) -> Optional[bytes]:
        try:
            return self._keys.get_bytes(request_id)
        except errors.KeyRevokedError:
            return None
        except errors.KeyNotFoundError:
            raise KeyError(request_id) from None

    def __setitem__(self, request_id: str, value: Optional[bytes]) -> None:
        if value is None:
            try:
                self._keys.revoke(request_id)
            except errors.KeyNotFoundError:
                # The seed accepts a sentinel for any id: store one (an empty key, revoked).
                self._keys[request_id] = b""
                self._keys.revoke(request_id)
            return
        self._keys[request_id] = value  # bytes-like only: Keys refuses an int or a str (TypeError)

    def __delitem__(self, request_id: str) -> None:
        try:
            self._keys.revoke(request_id)
        except errors.KeyNotFoundError:
            raise KeyError(request_id) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def clear(self) -> None:
        """Revoke every live key at once (each reads None until the owner purges it).

        MutableMapping's clear() pops until the mapping is empty, but a revoked id stays listed
        in the owner until its purge: it would spin for the whole purge delay."""
        for rid, revoked in self._keys.entries():
            if not revoked:
                try:
                    self._keys.revoke(rid)
                except errors.KeyNotFoundError:
                    pass  # revoked or purged meanwhile

    def popitem(self) -> tuple:
        """Revoke a live key and return ``(request id, key)``; KeyError if no key is live."""
        for rid, revoked in self._keys.entries():
            if revoked:
                continue
            try:
                key = self._keys.get_bytes(rid)
                self._keys.revoke(rid)
            except (errors.KeyRevokedError, errors.KeyNotFoundError):
                continue
            return rid, key
        raise KeyError("popitem(): no live key")

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._keys

    def copy(self) -> dict:
        """A plain dict snapshot, as DictProxy.copy() gives."""
        out = {}
        for rid, revoked in self._keys.entries():
            try:
                out[rid] = self[rid]
            except KeyError:
                pass
        return out


class _Manager(Generator):
    """The generator registry_manager_main_process returns; also a context manager."""

    def __init__(self) -> None:
        self._gen = self._run()

    def _run(self):
        global _owner
        with _lock:
            if _owner is not None:
                raise KeyRegistryPreviouslyInitializedError(
                    "the key registry was previously initialized in this process")
            secret = _secret()
            try:
                owner = Owner(_namespace(), secret=secret, grace=PURGE_DELAY_SECONDS)
            except errors.PreviouslyInitializedError as e:
                raise KeyRegistryPreviouslyInitializedError(str(e)) from e
            _owner = owner
        try:
            yield owner
        finally:
            with _lock:
                _owner = None
            owner.close()

    def send(self, value: Any) -> Any:
        return self._gen.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        return self._gen.throw(typ, val, tb)

    def close(self) -> None:
        self._gen.close()

    def __del__(self) -> None:
        try:
            self._gen.close()
        except Exception:  # interpreter shutdown: the owner's finalizer releases it
            pass

    def __enter__(self) -> Owner:
        return next(self)

    def __exit__(self, *exc: Any) -> None:
        self.close()


def registry_manager_main_process() -> Generator[Owner, None, None]:
    """Start the registry manager (the region's owner) in the main process.

    Keep the returned generator in a variable and advance it once (``next(gen)`` yields the
    manager); the manager stops when the generator is closed or garbage collected.

    Raises:
        KeyRegistryPreviouslyInitializedError: if a manager was started before (here or in
            another process, for the same secret and namespace).
        KeyRegistryAuthSecretNotDefinedError: if the secret environment variable is unset.
    """
    return _Manager()


def get_shared_registry() -> SharedKeyRegistry:
    """Get the shared key registry; changes are seen by every process at once.

    Can be run in any process, main or (spawned) child.

    Raises:
        KeyRegistryNotYetInitializedError: if no manager runs for this secret and namespace.
        KeyRegistryAuthSecretNotDefinedError: if the secret environment variable is unset.
    """
    global _client, _client_pid
    with _lock:
        if _owner is not None:
            return SharedKeyRegistry(_owner)
        if _client is not None and _client_pid == os.getpid():
            return SharedKeyRegistry(_client)
        secret = _secret()
        try:
            client = Client(_namespace(), secret=secret)
        except errors.NotYetInitializedError as e:
            raise KeyRegistryNotYetInitializedError(
                "the key registry has not yet been initialized: start it in the main process with "
                "registry_manager_main_process()") from e
        except errors.AuthSecretNotDefinedError as e:
            raise KeyRegistryAuthSecretNotDefinedError(str(e)) from e
        _client, _client_pid = client, os.getpid()
        return SharedKeyRegistry(client)


async def remove_key(request_id: str, shared_registry: MutableMapping) -> None:
    """Remove a key: mark it with the sentinel (None) so generation steps in flight do not crash,
    then remove it after PURGE_DELAY_SECONDS.

    The coroutine returns after PURGE_DELAY_SECONDS (60 s), as the seed's does: to go on at once,
    ``asyncio.create_task(remove_key(request_id, registry))`` (and keep the task). With a
    shmsteer registry the owner purges the sentinel itself after its grace period (also if this
    coroutine is cancelled); with any other mapping this coroutine deletes it.
    """
    shared_registry[request_id] = None
    await asyncio.sleep(PURGE_DELAY_SECONDS)
    if not isinstance(shared_registry, SharedKeyRegistry):
        try:
            if shared_registry[request_id] is None:
                del shared_registry[request_id]
        except KeyError:
            pass


__all__ = ["get_shared_registry", "registry_manager_main_process", "remove_key",
           "KeyRegistryAuthSecretNotDefinedError", "KeyRegistryNotYetInitializedError",
           "KeyRegistryPreviouslyInitializedError", "SharedKeyRegistry", "PURGE_DELAY_SECONDS"]
