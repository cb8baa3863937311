"""Owner.admit's typed result, strict steppers and typed phase errors (issue 41, item 13)."""

from __future__ import annotations

import numpy as np
import pytest

import shmsteer
from shmsteer import errors


@pytest.fixture
def owner(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=8, layers=2, grace=60) as o:
        yield o


def _override(x: float) -> dict:
    return {"decode": {"vectors": [{"hook": "post_block", "layer": 0, "scale": 1.0, "data": [x] * 8}]}}


def test_admit_returns_what_it_did(owner):
    a = owner.admit("r")
    assert isinstance(a, shmsteer.Admitted) and isinstance(a, int)
    assert a == a.version == owner.version, "still the version, as admit returned before"
    assert (a.source, a.latched, a.refused, a.replaced, a.bridged) == ("none", False, False, False, False)
    assert a.digest == bytes(32)

    again = owner.admit("r", override=_override(1.0))
    assert again.replaced, "a live id admitted again says so"
    assert again.source == "override" and again.digest != bytes(32)
    owner.end("r")
    assert not owner.admit("r").replaced, "ended: a new admission"

    first = owner.admit("c1", override=_override(2.0), conversation="conv")
    assert first.latched and first.source == "override"
    bridged = owner.admit("c2", conversation="conv")
    assert bridged.source == "latch" and bridged.bridged and not bridged.latched
    composed = owner.admit("c3", conversation="conv", override={**_override(1.0), "compose": 1})
    assert composed.source == "composed" and composed.bridged
    assert "source='latch'" in repr(bridged)


def test_strict_stepper_refuses_unknown_ids(owner, ns, secret):
    owner.admit("known")
    rows = np.zeros((2, 8), np.float32)
    spans = [("known", 0, 1, "decode"), ("typo", 1, 2, "decode")]
    with shmsteer.Client(ns, secret=secret) as c:
        with c.stepper(strict=True) as st:
            assert st.strict
            st.begin()
            with pytest.raises(errors.UnknownRequestError, match="typo"):
                st.apply("post_block", 0, rows, spans)
            st.end()
            st.strict = False
            st.begin()
            st.apply("post_block", 0, rows, spans)
            st.end()
            assert st.stats()["unknown_requests"] == 2  # counted in both steps
        with c.stepper() as st:
            assert not st.strict


def test_bad_phase_is_a_typed_error(owner):
    owner.admit("r")
    with owner.stepper() as st:
        st.begin()
        with pytest.raises(shmsteer.BadPhaseError, match="'generate'") as ei:
            st.apply("post_block", 0, np.zeros((1, 8), np.float32), [("r", 0, 1, "generate")])
        assert isinstance(ei.value, errors.InvalidArgumentError)
        assert isinstance(ei.value, shmsteer.ShmsteerError)
        assert isinstance(ei.value, KeyError), "code catching the old KeyError still does"
        st.end()
