"""Probe vectors: named vectors of kind "probe", in a namespace of their own."""

from __future__ import annotations

import numpy as np
import pytest

import shmsteer
from shmsteer import errors


def test_register_probe_from_owner_and_client(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=8, layers=4) as owner, shmsteer.Client(ns, secret=secret) as c:
        p = np.arange(8, dtype=np.float32)
        owner.register_vector("p", [("post_block", 2, 1.0, p)], kind="probe")
        c.register_vector("p", [("pre_attn", 0, 1.0, np.ones(8, np.float32))])  # a steering vector of that name
        c.register_vector("q", [("mlp_in", 1, 0.5, p)], kind="probe")  # from a worker, through the owner
        with c.snapshot() as s:
            e = s.vector("p", kind="probe").entries[0]
            assert (e.hook, e.layer) == ("post_block", 2)
            np.testing.assert_array_equal(e.data, p)
            del e  # a view pins its version until it goes
            assert s.vector("p").entries[0].hook == "pre_attn"
            assert sorted(x["name"] for x in s.vectors(kind="probe")) == ["p", "q"]  # listed in index order
            assert [x["name"] for x in s.vectors()] == ["p"]
        with pytest.raises(errors.ProbeSiteError):
            c.register_vector("two", [("post_block", 0, 1.0, p), ("post_block", 1, 1.0, p)], kind="probe")
        with pytest.raises(ValueError, match="kind"):
            c.register_vector("x", [("post_block", 0, 1.0, p)], kind="gate")
        c.unregister_vector("q", kind="probe")
        with pytest.raises(errors.UnknownVectorError):
            owner.unregister_vector("q", kind="probe")
        with c.snapshot() as s:
            with pytest.raises(errors.UnknownVectorError):
                s.vector("q", kind="probe")
            assert s.vector("p").entries[0].hook == "pre_attn", "the steering vector stays"
