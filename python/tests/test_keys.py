"""Both key get paths of shmsteer.keys: the extension's (shmsteer._fastkeys, a C type slot over
shmsteer_reader_key_get) and the ctypes one. Each test runs on both, on the same handle, and
they must give the same answers and raise the same exceptions with the same messages."""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import sysconfig
import threading
from typing import Any, Callable, Tuple

import pytest

import shmsteer
from shmsteer import errors
from shmsteer import keys as K
from workers import wait_forked

PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(shmsteer.__file__)))


def _headers_here() -> bool:
    """Whether this interpreter has Python.h, so `go generate ./capi` built the extension."""
    return os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h"))


def _need_fast() -> None:
    if K.FAST_KEYS:
        return
    if _headers_here() and not os.environ.get(K.KEYS_CTYPES_ENV):
        pytest.fail(f"Python.h is installed but the extension is not in use: {K.FAST_KEYS_REASON}")
    pytest.skip(f"the key get extension is not in use: {K.FAST_KEYS_REASON}")


@pytest.fixture(params=["extension", "ctypes"])
def path(request) -> bool:
    """fast: True for the extension's get, False for the ctypes one."""
    fast = request.param == "extension"
    if fast:
        _need_fast()
    return fast


def _outcome(fn: Callable[[], Any]) -> Tuple[str, Any]:
    try:
        return "value", fn()
    except Exception as e:  # the type and the message are part of the answer
        return type(e).__name__, str(e)


def test_handles_use_the_extension_when_built():
    _need_fast()
    with shmsteer.Owner("pytest-keys-" + os.urandom(8).hex(), secret=b"s" * 16) as o:
        assert type(o.keys) is K._FastKeys and isinstance(o.keys, K.Keys)
        assert type(o.keys).__getitem__ is shmsteer._fastkeys.KeysBase.__getitem__


def test_env_forces_the_ctypes_get():
    code = ("import shmsteer, shmsteer.keys as K\n"
            "o = shmsteer.Owner('pytest-keys-' + __import__('os').urandom(8).hex(), secret=b's' * 16)\n"
            "o.keys['a'] = b'v'\n"
            "print(K.FAST_KEYS, type(o.keys).__name__, o.keys['a'] == b'v', K.FAST_KEYS_REASON)\n"
            "o.close()\n")
    env = dict(os.environ, PYTHONPATH=PKG_DIR, **{K.KEYS_CTYPES_ENV: "1"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(None, 3) == ["False", "Keys", "True", f"${K.KEYS_CTYPES_ENV} is set\n"]


def test_new_keys_without_the_extension_raises(monkeypatch):
    monkeypatch.setattr(K, "_FastKeys", None)
    with pytest.raises(ImportError, match="not in use"):
        K.new_keys(None, fast=True)  # type: ignore[arg-type]


@pytest.fixture
def owner(ns, secret):
    with shmsteer.Owner(ns, secret=secret, grace=60) as o:
        yield o


def test_same_answers_on_both_paths(ns, secret):
    _need_fast()
    with shmsteer.Owner(ns, secret=secret, max_key_bytes=20000) as o, shmsteer.Client(ns, secret=secret) as c:
        big = bytes(range(256)) * 40  # longer than the key buffer (8 KiB)
        o.keys.update({"live": b"\x00k\xff", "empty": b"", "big": big, "a\x00b": b"nul-id", "a": b"not this one",
                       "é": b"utf-8 id", "gone": b"x"})
        del o.keys["gone"]
        ids = ["live", b"live", "empty", "big", "a\x00b", b"a\x00b", "a", "é", "é".encode(), "gone", "missing", "",
               b"", "x" * 300, bytearray(b"live"), 7, None, "\udc80"]
        fast, ctypes_keys = K.new_keys(c, fast=True), K.new_keys(c, fast=False)
        want = {"live": b"\x00k\xff", "empty": b"", "big": big, "a\x00b": b"nul-id", "a": b"not this one",
                "é": b"utf-8 id"}
        for i in ids:
            got = _outcome(lambda: fast[i])
            assert got == _outcome(lambda: ctypes_keys[i]), i
            assert got == _outcome(lambda: fast.get_bytes(i)), i
            key = i.decode() if isinstance(i, bytes) else i
            if isinstance(key, str) and key in want:
                assert got == ("value", want[key]), i
        assert _outcome(lambda: fast["gone"])[0] == "KeyRevokedError"
        assert _outcome(lambda: fast["missing"])[0] == "KeyNotFoundError"
        assert "gone" in fast and "missing" not in fast and 7 not in fast
        with pytest.raises(KeyError):  # KeyNotFoundError is a KeyError: Mapping.get works
            fast["missing"]
        assert fast.get("missing") is None and fast.get("live") == b"\x00k\xff"


def test_every_write_seen_by_the_next_get(owner, ns, secret, path):
    with shmsteer.Client(ns, secret=secret) as c:
        k = K.new_keys(c, fast=path)
        for i in range(200):
            owner.keys["r"] = b"v%d" % i
            assert k["r"] == b"v%d" % i
            if i % 50 == 49:
                del owner.keys["r"]
                with pytest.raises(errors.KeyRevokedError):
                    k["r"]


def test_threads_read_through_their_own_readers(owner, ns, secret, path):
    # More threads than THREAD_READERS, each reading while the owner rewrites: every answer is
    # a value the owner wrote for that id, at most THREAD_READERS readers are open, and every
    # thread's reader goes back when the thread ends.
    n = K.THREAD_READERS + 4
    for i in range(n):
        owner.keys[f"t{i}"] = b"t%d-0" % i
    with shmsteer.Client(ns, secret=secret) as c:
        k = K.new_keys(c, fast=path)
        start, stop, all_read = threading.Event(), threading.Event(), threading.Barrier(n + 1)
        bad, counts = [], []

        def run(i: int) -> None:
            start.wait(10)
            prefix = b"t%d-" % i
            got = k[f"t{i}"]
            all_read.wait(10)
            while not stop.is_set():
                if not got.startswith(prefix):
                    bad.append((i, got))
                got = k[f"t{i}"]
        ts = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
        for t in ts:
            t.start()
        start.set()
        all_read.wait(10)
        counts.append(k._readers[0])
        for r in range(1, 30):
            for i in range(n):
                owner.keys[f"t{i}"] = b"t%d-%d" % (i, r)
        stop.set()
        for t in ts:
            t.join(10)
        gc.collect()
        assert not bad
        assert counts == [K.THREAD_READERS]
        assert k._readers[0] == 0
        assert k["t0"] == b"t0-29"  # this thread's own reader, opened now


def test_many_keys_objects_in_one_thread(ns, secret, path):
    # More Keys objects than the extension's per-thread cache holds, over two regions with the
    # same ids: each answers from its own region, alternately and after others were collected.
    with shmsteer.Owner(ns, secret=secret) as a, shmsteer.Owner(ns + "-2", secret=secret) as b:
        a.keys["id"], b.keys["id"] = b"from a", b"from b"
        ks = [(K.new_keys(h, fast=path), want) for _ in range(4) for h, want in ((a, b"from a"), (b, b"from b"))]
        for _ in range(3):
            for k, want in ks:
                assert k["id"] == want
        del ks
        gc.collect()
        for _ in range(3):
            for h, want in ((a, b"from a"), (b, b"from b")):
                assert K.new_keys(h, fast=path)["id"] == want


def test_closed_handle_raises_closed_error(ns, secret, path):
    with shmsteer.Owner(ns, secret=secret) as o:
        o.keys["k"] = b"v"
        c = shmsteer.Client(ns, secret=secret)
        k, ref = K.new_keys(c, fast=path), K.new_keys(c, fast=False)
        assert k["k"] == b"v"  # this thread's reader is open (and cached by the extension)
        c.close()
        seen = [_outcome(lambda: k["k"]), _outcome(lambda: k.get_bytes(b"k"))]
        t = threading.Thread(target=lambda: seen.append(_outcome(lambda: k["k"])))  # no reader yet
        t.start()
        t.join(10)
        assert seen == [_outcome(lambda: ref["k"])] * 3
        assert seen[0][0] == "ClosedError"
        assert k._readers[0] == 1 and not c._reader_handles  # the closed thread's: none counted


def test_forked_child_gets_forked_error(ns, secret, path):
    with shmsteer.Owner(ns, secret=secret) as o:
        o.keys["k"] = b"v"
        k = K.new_keys(o, fast=path)
        assert k["k"] == b"v"  # the reader is open (and cached) before the fork
        pid = os.fork()
        if pid == 0:  # the child: the get must fail fast with ForkedError
            code = 1
            try:
                k["k"]
            except errors.ForkedError:
                code = 0
            except BaseException:
                code = 3
            os._exit(code)
        assert wait_forked(pid) == 0
        assert k["k"] == b"v"


def test_c_reader_after_its_handle_closed(ns, secret):
    """shmsteer.h: a reader left open when its handle closes is freed with it. A reader the
    package does not know of (opened through the C ABI directly) answers BAD_HANDLE afterwards
    through every get, without reading the unmapped region (it faulted once, then answered
    CLOSED from the handle table until shmsteer_reader_close); closing it then does nothing, and
    a reader of a later handle never answers to it."""
    lib = shmsteer._lib.lib
    own = ctypes.CDLL(lib._name)  # prototypes of its own: the package's function objects keep theirs
    get = own.shmsteer_reader_key_get
    get.restype = ctypes.c_int
    get.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                    ctypes.POINTER(ctypes.c_size_t)]
    get_tls = own.shmsteer_reader_key_get_tls
    get_tls.restype = ctypes.c_int64
    get_tls.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    bad = errors.BadHandleError.code
    with shmsteer.Owner(ns, secret=secret) as o:
        o.keys["k"] = b"v"
        c = shmsteer.Client(ns, secret=secret)
        r = ctypes.c_void_p()
        assert lib.shmsteer_reader_open(ctypes.c_void_p(c.handle), ctypes.byref(r)) == 0
        buf, n = ctypes.create_string_buffer(64), ctypes.c_size_t()
        assert get(r, b"k", 1, buf, 64, ctypes.byref(n)) == 0 and buf.raw[: n.value] == b"v"
        c.close()
        for key in (b"k", b"missing"):
            assert get(r, key, len(key), buf, 64, ctypes.byref(n)) == bad
            assert get_tls(r, key) == -bad
        c2 = shmsteer.Client(ns, secret=secret)
        r2 = ctypes.c_void_p()
        assert lib.shmsteer_reader_open(ctypes.c_void_p(c2.handle), ctypes.byref(r2)) == 0
        assert get(r, b"k", 1, buf, 64, ctypes.byref(n)) == bad, "the freed reader beside a new one"
        assert lib.shmsteer_reader_close(r) == bad
        assert get(r2, b"k", 1, buf, 64, ctypes.byref(n)) == 0 and buf.raw[: n.value] == b"v"
        assert c2.keys["k"] == b"v"
        assert lib.shmsteer_reader_close(r2) == 0
        c2.close()
