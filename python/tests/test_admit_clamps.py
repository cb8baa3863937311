"""Clamps by address (shmsteer_request_admit_buffers): an override tier's clamps, directions as
float lists, numpy arrays or torch tensors, go to the engine as float32 buffers, a tier at a
time, and publish the same request entry, and steer rows the same, as the same clamps in the
admission JSON; a tier with a clamp in any other form stays in the JSON; bad clamps raise the
package's typed errors and admit nothing."""

from __future__ import annotations

from typing import Any, Callable, Dict, List

import numpy as np
import pytest
import torch

import shmsteer
import shmsteer.client
from shmsteer import errors
from shmsteer.admission import split_clamps

HIDDEN, LAYERS = 16, 3


@pytest.fixture
def owner(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
        yield o


def _dir(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(HIDDEN).astype(np.float32)


def _clamp(seed: int, conv: Callable[[np.ndarray], Any], **kw: Any) -> Dict[str, Any]:
    c = {"hook": "post_block", "layer": 1, "dir": conv(_dir(seed)), "min": -0.25, "max": 0.5, "strength": 1.0}
    c.update(kw)
    return c


def _override(conv: Callable[[np.ndarray], Any]) -> Dict[str, Any]:
    """Clamps in two tiers; the decode tier's two at one site apply in order. A vector, too."""
    return {"base": {"vectors": [{"hook": "mlp_in", "layer": 0, "scale": 1.0, "data": _dir(7).tolist()}],
                     "clamps": [_clamp(1, conv, hook="pre_attn", layer=0, min=0.0, max=0.0)]},
            "decode": {"clamps": [_clamp(2, conv, min=0.75, max=0.75, strength=0.5), _clamp(3, conv, layer=1)]}}


def _json_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Owner.admit as before clamps went by address: every clamp in the JSON."""
    monkeypatch.setattr(shmsteer.client, "split_clamps", lambda o, h, n: (o, None, []))


def _steered(owner: shmsteer.Owner, rid: str) -> np.ndarray:
    out = []
    with owner.stepper() as st:
        st.begin()
        for hook in ("pre_attn", "post_block", "mlp_in"):
            for layer in range(LAYERS):
                rows = np.tile(_dir(9) * 2, (2, 1))
                st.apply(hook, layer, rows, [(rid, 0, 1, "prefill"), (rid, 1, 2, "decode")])
                out.append(rows)
        st.end()
    return np.stack(out)


def _as_float64_list(a: np.ndarray) -> List[float]:
    return a.astype(np.float64).tolist()


CONVERSIONS = {
    "list": _as_float64_list,
    "numpy": lambda a: a,
    "numpy float64": lambda a: a.astype(np.float64),
    "torch": torch.from_numpy,
    "torch strided": lambda a: torch.from_numpy(np.repeat(a, 2))[::2],
}


@pytest.mark.parametrize("kind", sorted(CONVERSIONS))
def test_clamps_by_address_equal_json(owner, monkeypatch, kind):
    conv = CONVERSIONS[kind]
    _, arr, _ = split_clamps(_override(conv), owner._hook_ids(), HIDDEN)
    assert arr is not None and [(c.tier, c.layer, c.min, c.max, c.strength) for c in arr] == \
        [(0, 0, 0.0, 0.0, 1.0), (2, 1, 0.75, 0.75, 0.5), (2, 1, -0.25, 0.5, 1.0)], "every clamp, in order"
    by_address = owner.admit("r-buf", override=_override(conv), conversation="c1")
    with monkeypatch.context() as m:
        _json_only(m)
        js = owner.admit("r-json", override=_override(_as_float64_list), conversation="c2")
    assert by_address.digest == js.digest, "the same request entry"
    steered = _steered(owner, "r-buf")
    assert np.array_equal(steered, _steered(owner, "r-json"))
    assert not np.array_equal(steered, np.stack([np.tile(_dir(9) * 2, (2, 1))] * 9)), "the clamps moved rows"


def test_clamp_order_is_kept(owner):
    over = _override(lambda a: a)
    swapped = _override(lambda a: a)
    swapped["decode"]["clamps"].reverse()
    assert owner.admit("a", override=over).digest != owner.admit("b", override=swapped).digest


def test_a_tier_with_another_form_stays_json(owner, monkeypatch):
    """A clamp with a key the plain form does not have keeps its whole tier in the JSON (the
    other tier still goes by address), and the engine judges it as before."""
    over = _override(lambda a: a)
    over["decode"]["clamps"][1] = dict(over["decode"]["clamps"][1], dir=_dir(3).tolist(), Extra=1)
    rest, arr, _ = split_clamps(over, owner._hook_ids(), HIDDEN)
    assert arr is not None and len(arr) == 1 and rest["decode"] is over["decode"]
    assert "clamps" not in rest["base"] and over["base"]["clamps"], "the caller's dict is not changed"
    strings = _override(_as_float64_list)
    strings["decode"]["clamps"][0]["dir"][3] = "x"
    rest, arr, _ = split_clamps(strings, owner._hook_ids(), HIDDEN)
    assert len(arr) == 1 and rest["decode"] is strings["decode"]
    v0 = owner.version
    with pytest.raises(errors.InvalidArgumentError):
        owner.admit("bad", override=strings)
    with monkeypatch.context() as m:
        _json_only(m)
        with pytest.raises(errors.InvalidArgumentError):
            owner.admit("bad", override=strings)
    assert owner.version == v0


def _one(**kw: Any) -> Dict[str, Any]:
    return {"decode": {"clamps": [_clamp(1, lambda a: a, **kw)]}}


BAD = [
    ("min > max", _one(min=1.0, max=0.0), errors.BadClampError),
    ("zero dir", _one(dir=np.zeros(HIDDEN, np.float32)), errors.BadClampError),
    ("strength 2", _one(strength=2.0), errors.BadClampError),
    ("negative strength", _one(strength=-0.5), errors.BadClampError),
    ("nan dir", _one(dir=np.full(HIDDEN, np.nan, np.float32)), errors.NonFiniteError),
    ("inf in a list", _one(dir=[float("inf")] + [0.0] * (HIDDEN - 1)), errors.NonFiniteError),
    ("beyond float32", _one(dir=[1e300] + [0.0] * (HIDDEN - 1)), errors.NonFiniteError),
    ("inf max", _one(max=float("inf")), errors.NonFiniteError),
    ("short", _one(dir=np.zeros(HIDDEN - 1, np.float32)), errors.HiddenSizeError),
    ("2-D", _one(dir=np.zeros((1, HIDDEN), np.float32)), errors.InvalidArgumentError),
    ("unknown hook", _one(hook="nope"), errors.UnknownHookError),
    ("layer", _one(layer=LAYERS), errors.LayerRangeError),
]


@pytest.mark.parametrize("name,override,err", BAD, ids=[b[0] for b in BAD])
def test_bad_clamps_raise_typed_errors(owner, name, override, err):
    if name not in ("short", "2-D", "unknown hook"):  # those are refused while taken out
        assert split_clamps(override, owner._hook_ids(), HIDDEN)[1] is not None, "by address: the engine refuses"
    v0 = owner.version
    with pytest.raises(err):
        owner.admit("bad", override=override)
    assert owner.version == v0, "nothing admitted"
