"""The plugin's frontend pieces: request events (``on_request``), the key registry kept in step
with them (``bind_key_registry``), and the checks against the owner that make an unknown
``steering_name`` a 400 with the fork's text and a gate the owner refuses (an unknown vector, a
probe's sites, an inline vector's width) a 400 with the owner's (``check_named_refs``), without vLLM; and the events
from vLLM's own ``OutputProcessor``, patched, where vLLM is importable (skipped otherwise).
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import shmsteer
from shmsteer import keyregistry
from shmsteer.openai import SteeringRequestError
from shmsteer.vllm import engine
from shmsteer.vllm.requests import RequestStart, bind_key_registry, on_request, request_ended, request_started

NO_VLLM = "vllm is not importable in this interpreter (bash .ci/pyenv-vllm makes one that has it; docs/vllm.md)"


def _start(rid: str, **extra) -> RequestStart:
    return RequestStart(rid, rid.rsplit("-", 1)[0], extra)


def test_listeners_run_once_per_started_request_and_can_be_removed():
    seen = []
    remove = on_request(lambda r: seen.append(("start", r.request_id, r.external_id)),
                        lambda rid: seen.append(("end", rid)))
    try:
        request_started(_start("cmpl-1-0-abcd1234"))
        request_ended("cmpl-1-0-abcd1234")
        request_ended("cmpl-1-0-abcd1234")  # an abort after the finish: ended once
        request_ended("never-started")
    finally:
        remove()
    request_started(_start("cmpl-2-0-abcd1234"))
    request_ended("cmpl-2-0-abcd1234")
    assert seen == [("start", "cmpl-1-0-abcd1234", "cmpl-1-0"), ("end", "cmpl-1-0-abcd1234")]


def test_a_refusing_start_listener_undoes_the_others_and_raises():
    reg = {}
    remove_keys = bind_key_registry(reg, lambda r: b"k" * 8)

    def refuse(_r):
        raise ValueError("no key for this tenant")

    remove_refuse = on_request(refuse)
    try:
        with pytest.raises(ValueError, match="no key for this tenant"):
            request_started(_start("cmpl-3-0-abcd1234"))
        assert reg == {"cmpl-3-0-abcd1234": None}, "the key set by the first listener was revoked"
    finally:
        remove_refuse()
        remove_keys()


def test_an_end_listener_error_is_logged_not_raised(caplog):
    remove = on_request(None, lambda rid: 1 / 0)
    try:
        request_started(_start("cmpl-4-0-abcd1234"))
        request_ended("cmpl-4-0-abcd1234")
    finally:
        remove()
    assert "end listener failed" in caplog.text


def test_bind_key_registry_sets_and_revokes_in_the_shared_registry(ns, secret, monkeypatch):
    monkeypatch.setenv("SHMSTEER_SECRET", secret.decode())
    monkeypatch.setenv("SHMSTEER_KEY_REGISTRY_NAMESPACE", ns)
    key = os.urandom(32)
    with keyregistry.registry_manager_main_process():
        registry = keyregistry.get_shared_registry()
        remove = bind_key_registry(registry, lambda r: key if r.extra_args.get("keyed") else None)
        try:
            request_started(_start("cmpl-5-0-abcd1234", keyed=1))
            request_started(_start("cmpl-6-0-abcd1234"))
            with shmsteer.Client(ns, secret=secret) as worker:  # what a worker reads, by the id it sees
                assert worker.keys.get_bytes("cmpl-5-0-abcd1234") == key
                assert "cmpl-6-0-abcd1234" not in worker.keys
                request_ended("cmpl-5-0-abcd1234")
                request_ended("cmpl-6-0-abcd1234")
                with pytest.raises(shmsteer.errors.KeyRevokedError):
                    worker.keys.get_bytes("cmpl-5-0-abcd1234")
            assert registry["cmpl-5-0-abcd1234"] is None
            assert "cmpl-6-0-abcd1234" not in registry
        finally:
            remove()


def test_unknown_named_vector_is_refused_with_the_forks_text(ns, secret, monkeypatch):
    monkeypatch.setitem(engine._state, "admissions", None)
    monkeypatch.setitem(engine._state, "frontend_client", None)
    monkeypatch.setenv("SHMSTEER_SECRET", secret.decode())
    monkeypatch.setenv("SHMSTEER_NAMESPACE", ns)
    kw = {"override": {"base": {"refs": [{"name": "calm", "strength": 1.0}]}}}
    engine.check_named_refs(kw)  # no owner answers: nothing to check here, the scheduler refuses
    with shmsteer.Owner(ns, secret=secret, hidden=8, layers=2) as owner:
        with pytest.raises(SteeringRequestError, match=r"^Unknown steering module 'calm'. Available: none$"):
            engine.check_named_refs(kw)
        owner.register_vector("happy", [("post_block", 1, 1.0, np.ones(8, np.float32))])
        owner.register_vector("apt", [("post_block", 0, 1.0, np.ones(8, np.float32))])
        with pytest.raises(SteeringRequestError,
                           match=r"^Unknown steering module 'calm'. Available: \['apt', 'happy'\]$") as e:
            engine.check_named_refs(kw)
        assert e.value.status == 400 and isinstance(e.value, ValueError)
        owner.register_vector("calm", [("post_block", 0, 1.0, np.ones(8, np.float32))])
        engine.check_named_refs(kw)
        engine.check_named_refs({"override": {"base": {"vectors": []}}})
    client = engine._state["frontend_client"]
    if client is not None:
        client.close()


def test_a_restarted_owner_is_read_not_the_old_region(ns, secret, monkeypatch):
    """The frontend's client of an owner that left reads the restarted owner's vectors: a
    snapshot of the old region would still read (its mapping outlives the owner), so the client
    asks the owner first and attaches again when it is gone."""
    monkeypatch.setitem(engine._state, "admissions", None)
    monkeypatch.setitem(engine._state, "frontend_client", None)
    monkeypatch.setenv("SHMSTEER_SECRET", secret.decode())
    monkeypatch.setenv("SHMSTEER_NAMESPACE", ns)
    calm = {"override": {"base": {"refs": [{"name": "calm", "strength": 1.0}]}}}
    zen = {"override": {"base": {"refs": [{"name": "zen", "strength": 1.0}]}}}
    with shmsteer.Owner(ns, secret=secret, hidden=8, layers=2) as owner:
        owner.register_vector("calm", [("post_block", 0, 1.0, np.ones(8, np.float32))])
        engine.check_named_refs(calm)
        first = engine._state["frontend_client"]
        assert first is not None
    with shmsteer.Owner(ns, secret=secret, hidden=8, layers=2) as owner:
        owner.register_vector("zen", [("post_block", 0, 1.0, np.ones(8, np.float32))])
        engine.check_named_refs(zen)  # the restarted owner's vector
        with pytest.raises(SteeringRequestError, match=r"^Unknown steering module 'calm'. Available: \['zen'\]$"):
            engine.check_named_refs(calm)
        assert engine._state["frontend_client"] is not first
    client = engine._state["frontend_client"]
    if client is not None:
        client.close()


def _packed(layers, width: int):
    import base64
    rows = np.ones((len(layers), width), np.float32)
    return {"dtype": "float32", "shape": [len(layers), width], "layer_indices": list(layers),
            "data": base64.b64encode(rows.tobytes()).decode()}


def test_gates_the_owner_refuses_are_refused_with_its_text(ns, secret, monkeypatch):
    """check_named_refs checks a request's gates as the owner's admission does, at the owner's
    current version (shmsteer_gates_check_at, through a Client here): a gate naming a vector the
    owner does not have, an inline probe at two sites, an inline vector of the wrong width are
    refused with the owner's typed error and its text, the request's id left out; without an
    owner only the gates' form is checked."""
    from shmsteer import errors
    monkeypatch.setitem(engine._state, "admissions", None)
    monkeypatch.setitem(engine._state, "frontend_client", None)
    monkeypatch.setenv("SHMSTEER_SECRET", secret.decode())
    monkeypatch.setenv("SHMSTEER_NAMESPACE", ns)
    always, probe = {"kind": "always"}, {"kind": "probe", "probe": {"kind": "name", "name": "p"}, "threshold": 0.0}
    add = {"kind": "add", "steer": {"kind": "name", "name": "calm"}, "strength": 1.0}

    def gates(when, apply):
        return {"steering": [{"when": when, "scope": "next_step", "apply": apply}]}

    unknown = gates(always, add)
    engine.check_named_refs(unknown)  # no owner answers: the form only, the scheduler refuses the rest
    with pytest.raises(errors.BadGateError):
        engine.check_named_refs(gates(always, {"kind": "scale"}))
    refused = {
        "unknown steering name": (unknown, errors.UnknownVectorError,
                                  'shmsteer: unknown named vector: steering[0].apply.steer: unknown steering vector '
                                  'name "calm"'),
        "unknown probe name": (gates(probe, {"kind": "attenuate", "strength": 0.5}), errors.UnknownVectorError,
                               'shmsteer: unknown named vector: steering[0].when.probe: unknown probe vector name "p"'),
        "probe at two sites": (gates({**probe, "probe": {"kind": "inline", "packed": {"post_block": _packed([0, 1], 8)}}},
                                     {"kind": "attenuate", "strength": 0.5}), errors.ProbeSiteError,
                               "shmsteer: a probe vector must name exactly one (hook, layer): steering[0].when.probe: "
                               "an inline probe names 2 sites"),
        "wrong width": (gates(always, {"kind": "add", "steer": {"kind": "inline", "packed": {"post_block": _packed([0], 7)}}}),
                        errors.HiddenSizeError, "steering[0].apply.steer: shmsteer: vector length is not the hidden size: "
                        "base vector 0 has 7 floats, hidden size is 8"),
    }
    with shmsteer.Owner(ns, secret=secret, hidden=8, layers=2) as owner:
        for case, (kw, exc, text) in refused.items():
            with pytest.raises(exc) as e:
                engine.check_named_refs(kw)
            assert str(e.value) == text, case
            assert isinstance(e.value, (ValueError, LookupError))
            with pytest.raises(exc) as admitted:
                owner.admit("r-1", steering=kw["steering"])
            assert str(admitted.value).replace('request "r-1": ', "") == text, case
        owner.register_vector("calm", [("post_block", 0, 1.0, np.ones(8, np.float32))])
        owner.register_vector("p", [("post_block", 1, 1.0, np.ones(8, np.float32))], kind="probe")
        engine.check_named_refs(unknown)  # registered since: admitted
        engine.check_named_refs(refused["unknown probe name"][0])
        with pytest.raises(SteeringRequestError, match="^Unknown steering module 'x'"):  # gates first, then names
            engine.check_named_refs({**unknown, "override": {"base": {"refs": [{"name": "x", "strength": 1.0}]}}})
        with pytest.raises(errors.ProbeSiteError):
            engine.check_named_refs({**refused["probe at two sites"][0],
                                     "override": {"base": {"refs": [{"name": "x", "strength": 1.0}]}}})
    client = engine._state["frontend_client"]
    if client is not None:
        client.close()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=NO_VLLM)
def test_vllms_output_processor_reports_start_abort_and_refusal():
    """vLLM's own OutputProcessor, patched: a request starts under the internal id that
    InputProcessor.assign_request_id makes, ends once when aborted by the client's id, and a
    listener's ValueError refuses it as vLLM's 400 (VLLMValidationError) with nothing added."""
    import time

    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.input_processor import InputProcessor
    from vllm.v1.engine.output_processor import OutputProcessor

    engine.patch_output_processor()
    op = OutputProcessor(None, log_stats=False)

    def request(rid: str, **extra) -> EngineCoreRequest:
        sp = SamplingParams(max_tokens=4, detokenize=False, extra_args=extra or None)
        r = EngineCoreRequest(rid, [5, 6, 7], None, sp, None, time.time(), None, None, None)
        InputProcessor.assign_request_id(r)
        return r

    seen = []
    remove = on_request(lambda r: seen.append(("start", r.request_id, r.external_id, dict(r.extra_args))),
                        lambda rid: seen.append(("end", rid)))
    try:
        r = request("cmpl-7-0", output_key="ab")
        op.add_request(r, None)
        assert r.request_id.startswith("cmpl-7-0-") and r.request_id != "cmpl-7-0"
        assert seen == [("start", r.request_id, "cmpl-7-0", {"output_key": "ab"})]
        assert op.abort_requests(["cmpl-7-0"], internal=False) == [r.request_id]
        op.abort_requests([r.request_id], internal=True)  # again: no second end
        assert seen[1:] == [("end", r.request_id)]

        def refuse(_r):
            raise ValueError("no key for this tenant")

        remove_refuse = on_request(refuse)
        try:
            bad = request("cmpl-8-0")
            with pytest.raises(VLLMValidationError, match="no key for this tenant") as e:
                op.add_request(bad, None)
            assert isinstance(e.value, ValueError)
            assert not op.has_request(bad.request_id)
            assert seen[-2:] == [("start", bad.request_id, "cmpl-8-0", {}), ("end", bad.request_id)]
        finally:
            remove_refuse()
    finally:
        remove()
