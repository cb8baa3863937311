"""The follower against a real ``shmsteer serve`` (the binary TestPython builds, found in
$SHMSTEER_SERVE_BIN): a Python worker re-follows a restarted serve, and with ``ready="serve"``
never steps with the empty region the restarted serve has before it restores its state; a
following capture consumer attaches again to a restarted serve's hub."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

import shmsteer
from shmsteer import errors
from shmsteer import capture
from shmsteer.capture import Begin, Consumer, End, Reattached

SERVE_BIN_ENV = "SHMSTEER_SERVE_BIN"
API_KEY = "admin-key-0123456789abcdef"
HIDDEN = 1024
#: Named vectors registered before the restart: enough that restoring them takes a while.
FILLER = 200


class Serve:
    """A `shmsteer serve` process on a state dir."""

    def __init__(self, binary: str, ns: str, secret: bytes, state: str, keys: str, extra: tuple = ()) -> None:
        args = [binary, "serve", "--http", "127.0.0.1:0", "--namespace", ns, "--hidden", str(HIDDEN),
                "--layers", "2", "--arena-bytes", str(64 << 20), "--api-key-file", keys, "--state-dir", state,
                "--persist-interval", "50ms", *extra]
        env = dict(os.environ, SHMSTEER_SECRET=secret.decode())
        self.started = time.monotonic()
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for line in self.proc.stdout:
            if line.startswith("listening on "):
                self.addr = "http://" + line.split(" ", 2)[2].strip()
                break
        else:
            raise RuntimeError("serve exited before listening")
        self.listening = time.monotonic()

    def post(self, path: str, body: dict = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.addr + path, data=data, method="POST" if data else "GET",
                                     headers={"Authorization": "Bearer " + API_KEY,
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{path}: {e.code} {e.read()!r}") from None

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def serve_bin() -> str:
    b = os.environ.get(SERVE_BIN_ENV)
    if not b:
        pytest.skip(f"{SERVE_BIN_ENV} not set: run through `go test ./capi -run TestPython`, which builds it")
    return b


def test_follower_refollows_a_restarted_serve_with_its_state(serve_bin, ns, secret, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(API_KEY + "\n")
    keys.chmod(0o600)
    state = str(tmp_path / "state")
    want = np.arange(HIDDEN, dtype=np.float32) * 0.5
    s = Serve(serve_bin, ns, secret, state, str(keys))
    try:
        def register(name: str, v: np.ndarray) -> None:
            s.post("/v1/steering/vectors/register", {"name": name, "kind": "steer", "packed": {"pre_attn": {
                "dtype": "float32", "shape": [2, HIDDEN], "layer_indices": [0, 1],
                "data": base64.b64encode(np.stack([v, v]).tobytes()).decode()}}})
        for i in range(FILLER):
            register(f"filler-{i}", want + i)
        register("v", want)
        time.sleep(0.5)  # persisted (--persist-interval 50ms)
        f = shmsteer.Follower(ns, secret=secret, ready="serve", poll=0.01, timeout=10)
        seen: list = []  # (generation, dead, has the vector)
        stop = threading.Event()

        def read_loop():
            while not stop.is_set():
                c, gen, dead = f.current()
                try:
                    with c.snapshot() as snap:
                        e = snap.vector("v").entries[0]
                        ok = np.array_equal(e.data, want)
                        del e
                except errors.ShmsteerError as ex:
                    ok = type(ex).__name__
                seen.append((gen, dead, ok, time.monotonic()))
                time.sleep(0.0005)
        t = threading.Thread(target=read_loop)
        t.start()
        time.sleep(0.1)
        s.stop()
        s = Serve(serve_bin, ns, secret, state, str(keys))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(g == 2 for g, *_ in seen):
            time.sleep(0.005)
        time.sleep(0.1)
        stop.set()
        t.join(10)
        gen2 = [x for x in seen if x[0] == 2]
        assert gen2, "the follower re-attached to the restarted serve"
        bad = [x for x in seen if x[2] is not True]
        assert not bad, f"a read saw no vector or the wrong one: {bad[:3]}"
        assert any(dead for _, dead, *_ in seen), "reads went on from the dead region meanwhile"
        took = gen2[0][3] - s.started
        print(f"\nre-followed with state {took * 1000:.1f} ms after the restarted serve was started "
              f"({(gen2[0][3] - s.listening) * 1000:.1f} ms after it listened)")
        f.close()
        with pytest.raises(errors.ClosedError):
            f.current()
    finally:
        s.kill()


def test_follower_any_owner(ns, secret):
    # Without ready, any owner does: a Python owner, closed and started again.
    o = shmsteer.Owner(ns, secret=secret, hidden=8, layers=2)
    o.keys["k"] = b"one"
    with shmsteer.Follower(ns, secret=secret, poll=0.01, timeout=5) as f:
        c, gen, dead = f.current()
        assert (c.keys["k"], gen, dead) == (b"one", 1, False)
        c.close()  # a no-op: the follower owns it
        assert f.client.keys["k"] == b"one"
        o.close()
        o = shmsteer.Owner(ns, secret=secret, hidden=8, layers=2)
        o.keys["k"] = b"two"
        deadline = time.monotonic() + 10
        while f.generation < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        c, gen, dead = f.current()
        assert (gen, dead) == (2, False)
        assert c.keys["k"] == b"two"
    o.close()
    with pytest.raises(errors.InvalidArgumentError):
        shmsteer.Follower(ns, secret=secret, ready="bogus")


def _until(c: Consumer, want, timeout: float = 10.0):
    """The first event of c that want accepts (others are skipped), within timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ev = c.next(timeout=0.2)
        if ev is not None and want(ev):
            return ev
    raise AssertionError("no such event within the timeout")


def test_capture_consumer_follows_a_restarted_serve(serve_bin, ns, secret, tmp_path):
    # Issue 41 item 2: a consumer with follow=True outlives its owner; one without raises.
    keys = tmp_path / "keys"
    keys.write_text(API_KEY + "\n")
    keys.chmod(0o600)
    state = str(tmp_path / "state")
    extra = ("--capture-consumer", "py=filesystem", "--capture-consumer", "once=filesystem")

    def admit(s: Serve, rid: str) -> None:
        s.post("/v1/requests/admit", {"request_id": rid, "prompt_len": 3, "capture": {"py": {
            "request_id": rid, "tag": "t", "hooks": {"post_block": "all"}, "positions": "all"}}})

    s = Serve(serve_bin, ns, secret, state, str(keys), extra)
    followed = once = None
    try:
        followed = Consumer(ns, "py", secret=secret, follow=True, retry=0.05)
        once = Consumer(ns, "once", secret=secret)
        assert followed.attachments == 1
        admit(s, "r1")
        assert _until(followed, lambda ev: isinstance(ev, Begin)).request_id == "r1"
        s.stop()
        with pytest.raises(errors.HubGoneError):
            while True:
                once.next(timeout=0.2)
        # The owner is away: the follower waits (no event, no error), and still does after the
        # wait outlived its first attempts.
        assert followed.next(timeout=0.3) is None
        assert followed.next_batch(timeout=0.3) == []
        with pytest.raises(errors.HubGoneError):
            followed.publish("r1", "ok")  # the lost connection's request: nothing to publish to
        s = Serve(serve_bin, ns, secret, state, str(keys), extra)
        ev = _until(followed, lambda ev: isinstance(ev, Reattached))
        assert ev == Reattached(2) and followed.attachments == 2
        admit(s, "r2")
        assert _until(followed, lambda ev: isinstance(ev, Begin)).request_id == "r2"
        s.post("/v1/requests/end", {"request_id": "r2"})
        assert _until(followed, lambda ev: isinstance(ev, End)).request_id == "r2"
        followed.publish("r2", "ok", payload=["x"])
        deadline = time.monotonic() + 10  # the result crosses the consumer's connection first
        while (status := s.post("/v1/requests/r2/capture")["py"]["status"]) == "pending":
            assert time.monotonic() < deadline, "the published result never reached the owner"
            time.sleep(0.01)
        assert status == "ok"
        # A consumer the owner does not declare is not waited for.
        with pytest.raises(errors.UnknownConsumerError):
            Consumer(ns, "nobody", secret=secret, follow=True)
        followed.close()
        with pytest.raises(capture.CaptureClosedError):
            followed.next(timeout=0)
    finally:
        for c in (followed, once):
            if c is not None:
                c.close()
        s.kill()
