"""What a newcomer reads in help(): the key registry attribute, remove_key's 60 s, the drop-in's
deliberate differences from DictProxy, and what snap.vector() returns."""

from __future__ import annotations

import pydoc

import shmsteer
from shmsteer import keyregistry


def test_help_mentions_keys() -> None:
    for cls in (shmsteer.Client, shmsteer.Owner):
        text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
        assert "keys:" in text and "Keys" in text, cls.__name__


def test_remove_key_says_it_waits() -> None:
    doc = keyregistry.remove_key.__doc__ or ""
    assert "60 s" in doc and "asyncio.create_task(remove_key(" in doc


def test_dropin_differences_listed() -> None:
    doc = keyregistry.__doc__ or ""
    assert "Deliberate differences from the seed's ``DictProxy``" in doc
    for what in ("``del registry[k]``", "``len``", "``popitem()``", "``clear()``", "``registry[k] = 123``"):
        assert what in doc, what
    assert "Deliberate differences" in (keyregistry.SharedKeyRegistry.__doc__ or "")


def test_package_doc_vector_is_named_vector() -> None:
    assert "nv.entries[0].data" in (shmsteer.__doc__ or "")
