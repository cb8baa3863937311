"""A GGUF control vector's model hint (controlvector.model_hint) is stored with the named
vector: import keeps the file's (or the one given), export writes it back unless another is
given, listings show it, and a bad hint is a typed error that changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

import shmsteer
from shmsteer import errors

HIDDEN, LAYERS = 8, 4


@pytest.fixture
def owner(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
        yield o


def _gguf(owner, tmp_path, name: str, hint: str) -> str:
    """A GGUF file of a post_block vector at layers 1-2 exported with model hint ``hint``."""
    rng = np.random.default_rng(5)
    src = str(tmp_path / f"{name}.npy")
    np.save(src, rng.standard_normal(HIDDEN).astype(np.float32))
    owner.import_vector(name + "-src", src, layers="1-2")
    path = str(tmp_path / f"{name}.gguf")
    owner.export_vector(name + "-src", path, model_hint=hint)
    return path


def test_model_hint_import_export_list(owner, ns, secret, tmp_path):
    path = _gguf(owner, tmp_path, "cv", "llama")
    imp = owner.import_vector("happy", path)
    assert imp.model_hint == "llama"
    with owner.snapshot() as snap:
        assert snap.model_hint("happy") == "llama"
        assert snap.model_hint("cv-src") == ""  # a .npy import has none
        listed = {v["name"]: v.get("model_hint", "") for v in snap.vectors()}
        assert listed["happy"] == "llama" and listed["cv-src"] == ""
        with pytest.raises(errors.UnknownVectorError):
            snap.model_hint("nope")

    # Export writes the stored hint back unless one is given ("" for none).
    for kwargs, want in [({}, "llama"), ({"model_hint": "qwen2"}, "qwen2"), ({"model_hint": ""}, "")]:
        out = str(tmp_path / "out.gguf")
        owner.export_vector("happy", out, **kwargs)
        assert owner.import_vector("back", out).model_hint == want, kwargs

    # A client's import and export go through the owner with the hint.
    with shmsteer.Client(ns, secret=secret) as c:
        assert c.import_vector("from-client", path, model_hint="gemma2").model_hint == "gemma2"
        out = str(tmp_path / "client.gguf")
        c.export_vector("from-client", out)
    assert owner.import_vector("back", out).model_hint == "gemma2"


@pytest.mark.parametrize("bad", ["two\nlines", "x" * 257, "nul\0byte", "bell\x07"])
def test_bad_model_hint_changes_nothing(owner, tmp_path, bad):
    path = _gguf(owner, tmp_path, "cv", "llama")
    owner.import_vector("happy", path)
    with owner.snapshot() as snap:
        before = (snap.vector("happy").version, snap.model_hint("happy"))
    with pytest.raises(errors.BadModelHintError) as ei:
        owner.import_vector("happy", path, model_hint=bad)
    assert isinstance(ei.value, ValueError)
    out = tmp_path / "bad.gguf"
    with pytest.raises(errors.BadModelHintError):
        owner.export_vector("happy", str(out), model_hint=bad)
    assert not out.exists()
    with owner.snapshot() as snap:
        assert (snap.vector("happy").version, snap.model_hint("happy")) == before
