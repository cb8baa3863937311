"""The seed's key registry, driven the way the seed's code drives it: the main process starts
the manager, spawned children read and write keys through get_shared_registry()."""

from __future__ import annotations

import asyncio
import multiprocessing
import time

import pytest

from shmsteer import keyregistry
from shmsteer.keyregistry import (KeyRegistryAuthSecretNotDefinedError,
                                  KeyRegistryNotYetInitializedError,
                                  KeyRegistryPreviouslyInitializedError, get_shared_registry,
                                  registry_manager_main_process, remove_key)

import workers


@pytest.fixture
def registry_env(monkeypatch, ns, secret):
    monkeypatch.setenv("SHMSTEER_SECRET", secret.decode())
    monkeypatch.setenv("SHMSTEER_KEY_REGISTRY_NAMESPACE", ns)
    monkeypatch.setattr(keyregistry, "PURGE_DELAY_SECONDS", 0.5)


def test_exceptions_are_runtime_errors():
    for cls in (KeyRegistryAuthSecretNotDefinedError, KeyRegistryNotYetInitializedError,
                KeyRegistryPreviouslyInitializedError):
        assert issubclass(cls, RuntimeError)


def test_seed_style_main_process_and_spawned_children(registry_env):
    registry_manager = registry_manager_main_process()
    next(registry_manager)  # the manager runs while the generator lives
    with pytest.raises(KeyRegistryPreviouslyInitializedError):
        next(registry_manager_main_process())

    shared_registry = get_shared_registry()
    request_ids = [f"req-{i}" for i in range(3)]
    for rid in request_ids:
        shared_registry[rid] = rid.encode() * 2

    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    children = [ctx.Process(target=workers.registry_child, args=(rid, q)) for rid in request_ids]
    for c in children:
        c.start()
    got = [q.get(timeout=60) for _ in range(2 * len(children))]
    for c in children:
        c.join(30)
        assert c.exitcode == 0
    reads = {rid: v for kind, rid, v in got if kind == "read"}
    assert reads == {rid: rid.encode() * 2 for rid in request_ids}
    for rid in request_ids:
        assert shared_registry["child-" + rid] == ("from-" + rid).encode()

    # remove_key: the sentinel (None) at once, gone after the purge delay.
    asyncio.run(remove_key("req-0", shared_registry))
    deadline = time.time() + 10
    while "req-0" in shared_registry and time.time() < deadline:
        time.sleep(0.05)
    assert "req-0" not in shared_registry
    with pytest.raises(KeyError):
        shared_registry["req-0"]

    shared_registry["req-1"] = None  # the revoked sentinel, as the seed writes it
    assert shared_registry["req-1"] is None
    assert shared_registry.get("req-1", b"default") is None
    assert shared_registry.get("never") is None
    assert shared_registry.copy()["req-2"] == b"req-2req-2"

    registry_manager.close()
    with pytest.raises(KeyRegistryNotYetInitializedError):
        get_shared_registry_fresh()


def get_shared_registry_fresh():
    """get_shared_registry in a process that holds no cached client (this one may)."""
    keyregistry._client = None
    return get_shared_registry()


def test_remove_key_marks_the_sentinel_before_it_waits(registry_env):
    with registry_manager_main_process():
        reg = get_shared_registry()
        reg["r"] = b"k"

        async def main():
            task = asyncio.create_task(remove_key("r", reg))
            await asyncio.sleep(0.05)
            assert reg["r"] is None  # generation steps in flight see the sentinel
            await task
        asyncio.run(main())


def test_missing_secret_and_missing_manager(registry_env, monkeypatch, spawn):
    q = spawn.Queue()
    p = spawn.Process(target=workers.registry_child_missing, args=(q,))
    p.start()
    assert q.get(timeout=60) == "not yet initialized"
    p.join(30)
    monkeypatch.delenv("SHMSTEER_SECRET")
    keyregistry._client = None
    with pytest.raises(KeyRegistryAuthSecretNotDefinedError):
        get_shared_registry()
    with pytest.raises(KeyRegistryAuthSecretNotDefinedError):
        next(registry_manager_main_process())


def test_clear_in_the_owner_returns_at_once(registry_env, monkeypatch):
    # MutableMapping.clear() pops until empty, but the owner lists a revoked id until its purge:
    # clear() spun for the whole purge delay (60 s). It revokes every live key and returns.
    import threading
    monkeypatch.setattr(keyregistry, "PURGE_DELAY_SECONDS", 60.0)
    manager = registry_manager_main_process()
    next(manager)
    try:
        reg = get_shared_registry()
        for i in range(5):
            reg[f"k{i}"] = b"v%d" % i
        reg["k0"] = None  # already revoked
        t = threading.Thread(target=reg.clear, daemon=True)
        start = time.monotonic()
        t.start()
        t.join(10)
        assert not t.is_alive(), "clear() did not return within 10 s"
        assert time.monotonic() - start < 10
        assert all(reg[f"k{i}"] is None for i in range(5))
        with pytest.raises(KeyError):
            reg.popitem()
        reg["p"] = b"pv"
        assert reg.popitem() == ("p", b"pv")
        assert reg["p"] is None
        with pytest.raises(TypeError):
            reg["n"] = 12
    finally:
        manager.close()
