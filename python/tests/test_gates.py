"""Declarative gates (the vLLM fork's "steering" field) through Owner.admit and the native step."""

from __future__ import annotations

import base64
import contextlib
import io
from pathlib import Path

import numpy as np
import pytest

import shmsteer
from shmsteer import errors
from shmsteer.openai import SteeringRequestError

D = 8


def _packed(layer: int, v: np.ndarray) -> dict:
    v = np.asarray(v, np.float32).reshape(1, -1)
    return {"dtype": "float32", "shape": list(v.shape), "layer_indices": [layer],
            "data": base64.b64encode(v.tobytes()).decode()}


def _unit(i: int) -> np.ndarray:
    v = np.zeros(D, np.float32)
    v[i] = 1
    return v


def _forward(st: shmsteer.Stepper, rid: str, h0: list) -> np.ndarray:
    """One decode step of rows whose h[0] is h0 through post_block 0, 1, 2: what each layer
    added to dimension 1, per row."""
    out = np.zeros((3, len(h0)), np.float32)
    st.begin()
    for layer in range(3):
        rows = np.zeros((len(h0), D), np.float32)
        rows[:, 0] = h0
        st.apply("post_block", layer, rows, [(rid, 0, len(h0), "decode")])
        out[layer] = rows[:, 1]
    st.end()
    return out


def test_probe_gated_add(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=D, layers=3) as owner, shmsteer.Client(ns, secret=secret) as c:
        owner.register_vector("p", [("post_block", 1, 1.0, _unit(0))], kind="probe")
        owner.register_vector("s", [("post_block", layer, 1.0, _unit(1)) for layer in range(3)])
        probe = {"kind": "probe", "probe": {"kind": "name", "name": "p"}, "threshold": 0.5, "sharpness": 100}
        owner.admit("tok", steering=[{"when": probe, "scope": "this_token",
                                      "apply": {"kind": "add", "steer": {"kind": "name", "name": "s"}, "strength": 2}}])
        inline = {"kind": "probe", "probe": {"kind": "inline", "packed": {"post_block": _packed(1, _unit(0))}}, "threshold": 0.5, "sharpness": 100}
        owner.admit("next", steering=[{"when": inline, "scope": "next_step",
                                       "apply": {"kind": "add", "steer": {"kind": "inline", "packed": {"post_block": _packed(2, _unit(1))}}}}])
        with c.stepper() as st:
            # this_token: the firing row is steered from the probe's layer on, the quiet one not
            np.testing.assert_allclose(_forward(st, "tok", [0.9, 0.1]), [[0, 0], [2, 0], [2, 0]], atol=1e-6)
            # next_step: one step after it fired, one step only
            np.testing.assert_allclose(_forward(st, "next", [0.9]), [[0], [0], [0]], atol=1e-6)
            np.testing.assert_allclose(_forward(st, "next", [0.1]), [[0], [0], [1]], atol=1e-6)
            np.testing.assert_allclose(_forward(st, "next", [0.1]), [[0], [0], [0]], atol=1e-6)


def test_gate_refusals_admit_nothing(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=D, layers=3) as owner:
        owner.register_vector("p", [("post_block", 1, 1.0, _unit(0))], kind="probe")
        owner.register_vector("s", [("post_block", 0, 1.0, _unit(1))])
        probe = {"kind": "probe", "probe": {"kind": "name", "name": "p"}, "threshold": 0}
        add = {"kind": "add", "steer": {"kind": "name", "name": "s"}}
        cases = [
            (errors.BadGateError, [{"when": probe, "scope": "forever", "apply": add}]),
            (errors.GateUnsupportedError, [{"when": probe, "scope": "this_token", "apply": {"kind": "attenuate", "strength": 0.5}}]),
            (errors.BadGateError, [{"when": dict(probe, sharpness=-1), "scope": "next_step", "apply": add}]),
            (errors.NonFiniteError, [{"when": dict(probe, threshold=1e39), "scope": "next_step", "apply": add}]),
            (errors.UnknownVectorError, [{"when": dict(probe, probe={"kind": "name", "name": "s"}), "scope": "next_step", "apply": add}]),
            (errors.ProbeSiteError, [{"when": dict(probe, probe={"kind": "inline", "packed": {"post_block": {
                "dtype": "float32", "shape": [2, D], "layer_indices": [0, 1],
                "data": base64.b64encode(np.zeros((2, D), np.float32).tobytes()).decode()}}}), "scope": "next_step", "apply": add}]),
            (errors.HiddenSizeError, [{"when": {"kind": "always"}, "scope": "next_step",
                                       "apply": {"kind": "add", "steer": {"kind": "inline", "packed": {"post_block": _packed(0, np.ones(3))}}}}]),
            (SteeringRequestError, [{"when": {"kind": "always"}, "scope": "next_step",
                                     "apply": {"kind": "add", "steer": {"kind": "inline", "packed": {"post_block": {"dtype": "int8"}}}}}]),
        ]
        before = owner.status()
        for exc, steering in cases:
            with pytest.raises(exc):
                owner.admit("r", steering=steering)
        after = owner.status()
        assert after["region"]["Version"] == before["region"]["Version"], "nothing written"
        assert after["steer"]["admitted_requests"] == 0
        assert issubclass(errors.BadGateError, ValueError) and issubclass(errors.GateUnsupportedError, ValueError)


def test_readme_gates_example() -> None:
    """docs/gates.md's probe-gated example runs as written."""
    readme = (Path(__file__).resolve().parents[2] / "docs" / "gates.md").read_text()
    _, section = readme.split("**Probe-gated steering.**", 1)
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/gates.md", "exec"), {})
    assert "steered only where the probe fired" in out.getvalue()
