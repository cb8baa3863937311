"""Activation capture through the vLLM plugin.

Below the engine (no vLLM needed): the settings the engine's owner reads
(``SHMSTEER_VLLM_CAPTURE``, ``_DIR``, ``_GLOBAL``) and the worker's capture start (rank 0 writes,
an owner without capture leaves the hooks not capturing).

End to end (vLLM's CPU build; skipped with the reason without it): tests/vllm_e2e_capture_run.py
runs a batch on the tiny random Llama with the owner in vLLM's engine writing the fork's files
(``SHMSTEER_VLLM_CAPTURE_DIR``): every captured request's files are read by the fork's reader
with the positions its spec selects, equal to transformers' hidden states at the same hook points
within float32's tolerance; requests without capture write nothing; a steered request captures
the values before its vector is added (and the next site sees them after); a request naming a
consumer the owner does not declare fails alone.
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

import shmsteer
from shmsteer.errors import CaptureConsumerTypeError
from shmsteer.vllm import capture as vcap
from shmsteer.vllm.errors import PluginConfigError

NO_VLLM = "vllm is not importable in this interpreter (bash .ci/pyenv-vllm makes one that has it; docs/vllm.md)"
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=NO_VLLM)


@pytest.fixture
def env(monkeypatch):
    for k in ("SHMSTEER_VLLM_CAPTURE", "SHMSTEER_VLLM_CAPTURE_DIR", "SHMSTEER_VLLM_CAPTURE_GLOBAL"):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_settings_none(env):
    assert vcap.owner_capture() == ({}, {}, None)


def test_settings_declare_dir_and_global(env, tmp_path):
    g = tmp_path / "g.json"
    g.write_text(json.dumps({"tag": "all", "hooks": {"post_block": [0]}, "positions": "last_prompt"}))
    env.setenv("SHMSTEER_VLLM_CAPTURE", " probe=filesystem ,")
    env.setenv("SHMSTEER_VLLM_CAPTURE_DIR", str(tmp_path / "caps"))
    env.setenv("SHMSTEER_VLLM_CAPTURE_GLOBAL", f"fs=@{g}")
    consumers, specs, root = vcap.owner_capture()
    assert consumers == {"probe": "filesystem", "fs": "filesystem"}
    assert specs == {"fs": {"tag": "all", "hooks": {"post_block": [0]}, "positions": "last_prompt"}}
    assert root == str(tmp_path / "caps")


@pytest.mark.parametrize("var, value", [
    ("SHMSTEER_VLLM_CAPTURE", "fs"),
    ("SHMSTEER_VLLM_CAPTURE", "=filesystem"),
    ("SHMSTEER_VLLM_CAPTURE", "fs=filesystem,fs=filesystem"),
    ("SHMSTEER_VLLM_CAPTURE_GLOBAL", "fs=/no/at"),
    ("SHMSTEER_VLLM_CAPTURE_GLOBAL", "fs=@/does/not/exist.json"),
    ("SHMSTEER_VLLM_CAPTURE_GLOBAL", "undeclared=@/x.json"),
], ids=["no-type", "no-name", "twice", "no-at", "missing-file", "undeclared"])
def test_settings_refused(env, tmp_path, var, value):
    env.setenv("SHMSTEER_VLLM_CAPTURE_DIR", str(tmp_path))
    env.setenv(var, value)
    with pytest.raises(PluginConfigError):
        vcap.owner_capture()


def test_settings_dir_conflicts_with_a_declared_fs(env, tmp_path):
    env.setenv("SHMSTEER_VLLM_CAPTURE", "fs=tape")
    env.setenv("SHMSTEER_VLLM_CAPTURE_DIR", str(tmp_path))
    with pytest.raises(PluginConfigError):
        vcap.owner_capture()


def test_settings_global_not_json(env, tmp_path):
    g = tmp_path / "g.json"
    g.write_text("{not json")
    env.setenv("SHMSTEER_VLLM_CAPTURE", "fs=filesystem")
    env.setenv("SHMSTEER_VLLM_CAPTURE_GLOBAL", f"fs=@{g}")
    with pytest.raises(PluginConfigError):
        vcap.owner_capture()


def test_unknown_type_is_the_owners_typed_error(env, ns, secret):
    env.setenv("SHMSTEER_VLLM_CAPTURE", "fs=tape")
    consumers, specs, _ = vcap.owner_capture()
    with pytest.raises(CaptureConsumerTypeError):
        shmsteer.Owner(ns, secret=secret, hidden=8, layers=2, capture_consumers=consumers, capture_global=specs)


def test_start_consumer_writes_and_stops(env, ns, secret, tmp_path):
    """The engine's filesystem consumer: started for the owner's namespace, counted at stop."""
    env.setenv("SHMSTEER_SECRET", secret.decode())
    with shmsteer.Owner(ns, hidden=8, layers=2, capture_consumers={"fs": "filesystem"}):
        vcap.start_consumer(ns, str(tmp_path))
        assert vcap.stop_consumer() == {"requests": 0, "ok": 0, "partial": 0, "failed": 0, "records": 0, "bytes": 0}
        assert vcap.stop_consumer() is None


def _engine_config(dp_rank: int, dp_size: int):
    from types import SimpleNamespace
    hf = SimpleNamespace(hidden_size=8, num_hidden_layers=2)
    return SimpleNamespace(model_config=SimpleNamespace(hf_text_config=hf),
                           parallel_config=SimpleNamespace(data_parallel_rank=dp_rank, data_parallel_size=dp_size))


def test_data_parallel_engines_keep_each_others_files(env, ns, secret, tmp_path):
    """Two data-parallel engines with one SHMSTEER_VLLM_CAPTURE_DIR: the second engine's start
    (its consumer removes the .tmp files under its root) leaves the first engine's files in
    flight alone, because each engine writes under a directory of its own (dp0, dp1)."""
    from shmsteer.vllm import engine
    env.setenv("SHMSTEER_SECRET", secret.decode())
    env.setenv("SHMSTEER_NAMESPACE", ns)
    env.setenv("SHMSTEER_VLLM_CAPTURE_DIR", str(tmp_path))
    env.delenv("SHMSTEER_VLLM_OWNER", raising=False)
    owners, roots = [], []
    try:
        for rank in (0, 1):  # each engine core is a process of its own: its module state is fresh
            env.setitem(engine._state, "admissions", None)
            env.setitem(engine._state, "owner", None)
            assert engine._make_owner(_engine_config(rank, 2)) is not None
            owners.append(engine._state["owner"])
            root = vcap._state["fs"].root
            roots.append(root)
            if rank == 0:  # engine 0 is writing a request: its unpublished file
                inflight = os.path.join(root, "tag", "req-0", "0_post_block.bin.tmp")
                os.makedirs(os.path.dirname(inflight))
                with open(inflight, "wb") as f:
                    f.write(b"\0" * 64)
        assert os.path.exists(inflight), "engine 1's start removed engine 0's file in flight"
        assert roots == [str(tmp_path / "dp0"), str(tmp_path / "dp1")]
    finally:
        vcap.stop_consumer()
        for o in owners:
            o.close()


def test_single_engine_writes_under_the_dir_itself(tmp_path):
    """One engine keeps the layout {dir}/{tag}/{request_id}/; a rank outside the engine count
    is a PluginConfigError."""
    assert vcap.consumer_root(str(tmp_path)) == str(tmp_path)
    assert vcap.consumer_root(str(tmp_path), 3, 4) == str(tmp_path / "dp3")
    for rank, size in ((1, 1), (-1, 2), (0, 0)):
        with pytest.raises(PluginConfigError, match="data-parallel rank"):
            vcap.consumer_root(str(tmp_path), rank, size)


def test_worker_capture_rank0_writes(ns, secret):
    torch = pytest.importorskip("torch", reason="torch not importable")
    from shmsteer.capture import Consumer, Record
    from shmsteer.torch_hook import SteeringHooks
    with shmsteer.Owner(ns, secret=secret, hidden=8, layers=2) as plain:
        hooks = SteeringHooks(plain)
        assert vcap.start_worker_capture(hooks, rank=0) is False  # no capture served
        hooks.close()
    with shmsteer.Owner(ns, secret=secret, hidden=8, layers=2, capture_consumers={"c": "filesystem"}) as o, \
            Consumer(ns, "c", secret=secret) as c:
        spec = {"request_id": "r", "tag": "t", "hooks": {"post_block": [0]}, "positions": "all"}
        o.admit("r", capture={"c": spec}, prompt_len=2)
        ranks = []
        for rank in (0, 1):
            hooks = SteeringHooks(o)
            layer = torch.nn.Identity()
            hooks.attach(layer, "post_block", 0)
            assert vcap.start_worker_capture(hooks, rank=rank) is True
            ranks.append((hooks, layer, rank))
        while c.next(timeout=0.2) is not None:  # the Begin, then the ring notices: c reads the rings
            pass
        for hooks, layer, rank in ranks:
            with hooks.step([("r", 0, 2, "prefill", 0)]):
                layer(torch.full((2, 8), float(rank + 1)))
        got = {}
        for _ in range(10):
            ev = c.next(timeout=0.2)
            if isinstance(ev, Record):
                got.setdefault(ev.request_id, []).append(ev.data.copy())
        for hooks, _, _ in ranks:
            hooks.close()
        assert list(got) == ["r"] and len(got["r"]) == 1  # rank 1 wrote nothing
        np.testing.assert_array_equal(got["r"][0], np.full((2, 8), 1.0, dtype=np.float32))


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    from test_vllm_e2e import run_script
    return run_script("vllm_e2e_capture_run.py", str(tmp_path_factory.mktemp("tiny-llama")))


def _cases():
    from vllm_e2e_capture_run import CASES, rid
    return CASES, rid


@needs_vllm
def test_vllm_captured_requests_equal_transformers(result):
    from vllm_e2e_capture_run import TAG, positions, sites
    from vllm_e2e_run import PROMPTS
    cases, rid = _cases()
    files, hf = result["files"], result["hf"]
    for i, (p, cap, _steer) in enumerate(cases):
        if cap is None:
            continue
        r, want = rid(i), hf[rid(i)]
        assert result["vllm"]["tokens"][i] == want["tokens"], f"{r}: vLLM's tokens differ from transformers'"
        got = files.get(f"{TAG}/{r}")
        assert got is not None, f"{r}: no files ({sorted(files)})"
        assert sorted(got) == sorted(f"{layer}_{hook}" for layer, hook in sites(cap["hooks"])), r
        pos = positions(cap["positions"], len(PROMPTS[p]))
        for site, g in got.items():
            assert g["dtype"] == "float32" and g["positions"] == pos, (r, site, g["positions"], pos)
            a, b = np.asarray(g["data"]), np.asarray(want["sites"][site])
            assert a.shape == b.shape == (len(pos), 256), (r, site, a.shape, b.shape)
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=f"{r} {site}")  # measured: 1.8e-6 at most


@needs_vllm
def test_vllm_requests_without_capture_write_nothing(result):
    from vllm_e2e_capture_run import TAG
    cases, rid = _cases()
    want = {f"{TAG}/{rid(i)}" for i, (_, cap, _) in enumerate(cases) if cap is not None}
    assert set(result["files"]) == want
    st = result["vllm"]["fs_stats"]
    assert st is not None and st["requests"] == st["ok"] == len(want) and st["failed"] == 0, st
    assert result["vllm"]["capturing"] is True
    assert result["vllm"]["live_after"] == {}


@needs_vllm
def test_vllm_steered_request_captures_before_its_vector(result):
    """Request 2 is steered at (post_block, 0) by vector(2): its capture there is transformers'
    value before the add (the comparison above), and pre_attn of layer 1, the same stream one
    site later, is that value plus the vector."""
    from vllm_e2e_capture_run import TAG
    from vllm_e2e_run import vector
    cases, rid = _cases()
    assert cases[2][2] == ("post_block", 0)
    got = result["files"][f"{TAG}/{rid(2)}"]
    before, after = np.asarray(got["0_post_block"]["data"]), np.asarray(got["1_pre_attn"]["data"])
    np.testing.assert_allclose(after - before, np.broadcast_to(vector(2).numpy(), before.shape), rtol=1e-4, atol=1e-4)


@needs_vllm
def test_vllm_undeclared_consumer_fails_that_request(result):
    v = result["vllm"]
    assert v["undeclared"] == "error", v["undeclared"]
    assert len(v["after"]) == 8


def test_scheduler_pins_each_steps_version(ns, secret):
    """Tensor parallelism: the version the scheduler hands a step's ranks stays pinned for the
    last PINNED_STEPS steps (a rank beginning late never finds it reclaimed), older ones are
    released."""
    from types import SimpleNamespace

    from shmsteer.vllm.engine import PINNED_STEPS, _pin
    sched = SimpleNamespace()
    with shmsteer.Owner(ns, secret=secret, hidden=8, layers=2) as o:
        versions = []
        for i in range(PINNED_STEPS + 2):
            o.admit(f"r{i}", override={"base": {"vectors": [{"hook": "post_block", "layer": 0, "scale": 1.0,
                                                             "data": [float(i)] * 8}]}})
            versions.append(_pin(sched, o))
            assert versions[-1] == o.version
        assert versions == sorted(set(versions)), versions  # each step a newer version
        pins = list(sched._shmsteer_pins)
        assert [p.version for p in pins] == versions[-PINNED_STEPS:]
        assert all(p.pinned for p in pins)
        st = o.stepper()
        st.begin(versions[-PINNED_STEPS])  # the oldest pinned version is still readable
        st.end()
        st.close()
        for p in pins:
            p.close()
