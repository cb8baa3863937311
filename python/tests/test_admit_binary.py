"""Binary admission (issue 43, item 3): an override's vectors given as numpy arrays or torch
tensors go to the engine by address (shmsteer_request_admit_binary) and publish the same request
entry, and steer rows the same, as the float lists of the JSON path; bad shapes, dtypes and
values raise the package's typed errors and admit nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import shmsteer
from shmsteer import errors
from shmsteer.admission import split_override

HIDDEN, LAYERS = 16, 3


@pytest.fixture
def owner(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
        o.register_vector("named", [("mlp_in", 1, 0.5, np.linspace(-1, 1, HIDDEN, dtype=np.float32))])
        yield o


def _data(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(HIDDEN).astype(np.float32)


def _override(conv) -> dict:
    """An override of every tier, vectors built by conv from float32 arrays, a ref and a clamp."""
    return {"base": {"vectors": [{"hook": "post_block", "layer": 0, "scale": 1.0, "data": conv(_data(1))},
                                 {"hook": "pre_attn", "layer": 2, "scale": -0.25, "data": conv(_data(2))}],
                     "refs": [{"name": "named", "strength": 2.0}]},
            "prefill": {"vectors": [{"hook": "post_block", "layer": 1, "scale": 3.0, "data": conv(_data(3))}]},
            "decode": {"vectors": [{"hook": "mlp_in", "layer": 1, "scale": 0.5, "data": conv(_data(4))}],
                       "clamps": [{"hook": "post_block", "layer": 0, "dir": [1.0] + [0.0] * (HIDDEN - 1),
                                   "min": -0.5, "max": 0.5, "strength": 1.0}]}}


def _steered(owner, rid: str) -> np.ndarray:
    """What rid's rows become at every (hook, layer), prefill and decode, from a fixed input."""
    out = []
    with owner.stepper() as st:
        st.begin()
        for hook in ("pre_attn", "post_block", "mlp_in"):
            for layer in range(LAYERS):
                rows = np.tile(_data(9), (2, 1))
                st.apply(hook, layer, rows, [(rid, 0, 1, "prefill"), (rid, 1, 2, "decode")])
                out.append(rows)
        st.end()
    return np.stack(out)


CONVERSIONS = {
    "numpy": lambda a: a,
    "numpy float64": lambda a: a.astype(np.float64),
    "numpy strided": lambda a: np.repeat(a, 2)[::2],
    "torch": torch.from_numpy,
    "torch float64": lambda a: torch.from_numpy(a).double(),
    "torch bfloat16": lambda a: torch.from_numpy(a).bfloat16(),
    "torch strided": lambda a: torch.from_numpy(np.repeat(a, 2))[::2],
    "torch requires_grad": lambda a: torch.from_numpy(a.copy()).requires_grad_(),
}


@pytest.mark.parametrize("kind", sorted(CONVERSIONS))
def test_binary_admission_equals_json(owner, kind):
    conv = CONVERSIONS[kind]
    if "bfloat16" in kind:  # the float lists of the bfloat16 values: the same numbers
        as_list = lambda a: torch.from_numpy(a).bfloat16().float().tolist()  # noqa: E731
    else:
        as_list = lambda a: a.tolist()  # noqa: E731
    js = owner.admit("r-json", override=_override(as_list), conversation="c1")
    _, vecs, _ = split_override(_override(conv), owner._hook_ids(), HIDDEN)
    assert vecs is not None and len(vecs) == 4, "every array went by address"
    binary = owner.admit("r-bin", override=_override(conv), conversation="c2")
    assert (binary.source, binary.latched) == (js.source, js.latched) == ("override", True)
    assert binary.digest == js.digest, "the same request entry"
    assert np.array_equal(_steered(owner, "r-bin"), _steered(owner, "r-json"))


def test_mixed_lists_and_arrays_steer_the_same(owner):
    mixed = _override(lambda a: a)
    mixed["base"]["vectors"][1]["data"] = _data(2).tolist()
    owner.admit("r-json", override=_override(lambda a: a.tolist()))
    owner.admit("r-mixed", override=mixed)
    assert np.array_equal(_steered(owner, "r-mixed"), _steered(owner, "r-json"))
    assert isinstance(mixed["base"]["vectors"][0]["data"], np.ndarray), "the caller's dict is not changed"


def test_binary_admission_latches_and_bridges(owner):
    first = owner.admit("a", override=_override(torch.from_numpy), conversation="conv")
    assert first.latched
    bridged = owner.admit("b", conversation="conv")
    assert bridged.source == "latch"
    assert np.array_equal(_steered(owner, "b"), _steered(owner, "a"))


def _one(data, **kw) -> dict:
    v = {"hook": "post_block", "layer": 1, "scale": 1.0, "data": data}
    v.update(kw)
    return {"decode": {"vectors": [v]}}


BAD = [
    ("2-D numpy", _one(np.zeros((1, HIDDEN), np.float32)), errors.InvalidArgumentError, "1-D"),
    ("2-D torch", _one(torch.zeros(2, HIDDEN // 2)), errors.InvalidArgumentError, "1-D"),
    ("0-D", _one(np.float32(1.0)), errors.InvalidArgumentError, "1-D"),
    ("bool", _one(np.ones(HIDDEN, bool)), errors.InvalidArgumentError, "real numbers"),
    ("complex", _one(np.ones(HIDDEN, np.complex64)), errors.InvalidArgumentError, "real numbers"),
    ("torch bool", _one(torch.ones(HIDDEN, dtype=torch.bool)), errors.InvalidArgumentError, "real numbers"),
    ("strings", _one(np.array(["a"] * HIDDEN)), errors.InvalidArgumentError, "real numbers"),
    ("object", _one(object()), errors.InvalidArgumentError, "real numbers"),
    ("short", _one(np.zeros(HIDDEN - 1, np.float32)), errors.HiddenSizeError, "decode vector 0 has 15 floats"),
    ("long torch", _one(torch.zeros(HIDDEN + 1)), errors.HiddenSizeError, "17 floats"),
    ("unknown hook", _one(np.zeros(HIDDEN, np.float32), hook="nope"), errors.UnknownHookError, "nope"),
    ("hook id", _one(np.zeros(HIDDEN, np.float32), hook=9), errors.UnknownHookError, "9"),
    ("layer", _one(np.zeros(HIDDEN, np.float32), layer=LAYERS), errors.LayerRangeError, "layer 3"),
    ("negative layer", _one(np.zeros(HIDDEN, np.float32), layer=-1), errors.LayerRangeError, "-1"),
    ("float layer", _one(np.zeros(HIDDEN, np.float32), layer=1.0), errors.InvalidArgumentError, "layer"),
    ("string scale", _one(np.zeros(HIDDEN, np.float32), scale="1"), errors.InvalidArgumentError, "scale"),
    ("nan", _one(np.full(HIDDEN, np.nan, np.float32)), errors.NonFiniteError, None),
    ("inf scale", _one(np.zeros(HIDDEN, np.float32), scale=float("inf")), errors.NonFiniteError, None),
    ("overflow", _one(np.full(HIDDEN, 1e30, np.float32), scale=2.0), errors.OverflowSteeringError, "MaxMagnitude"),
    ("unknown key", _one(np.zeros(HIDDEN, np.float32), Scale=1.0), errors.InvalidArgumentError, "unknown keys"),
    ("duplicate", {"decode": {"vectors": [_one(np.zeros(HIDDEN, np.float32))["decode"]["vectors"][0],
                                          _one(np.ones(HIDDEN, np.float32))["decode"]["vectors"][0]]}},
     errors.DuplicateError, None),
    ("duplicate of a list", {"decode": {"vectors": [_one([0.0] * HIDDEN)["decode"]["vectors"][0],
                                                    _one(np.ones(HIDDEN, np.float32))["decode"]["vectors"][0]]}},
     errors.DuplicateError, None),
]


@pytest.mark.parametrize("name,override,err,match", BAD, ids=[b[0] for b in BAD])
def test_bad_vectors_raise_typed_errors(owner, name, override, err, match):
    v0 = owner.version
    with pytest.raises(err, match=match):
        owner.admit("bad", override=override, conversation="c")
    assert owner.version == v0, "nothing admitted"
    with owner.stepper(strict=True) as st:  # the id has no entry: a strict stepper refuses it
        st.begin()
        with pytest.raises(errors.UnknownRequestError):
            st.apply("post_block", 1, np.zeros((1, HIDDEN), np.float32), [("bad", 0, 1, "decode")])
        st.end()
