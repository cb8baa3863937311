"""The torch this package's hooks need, checked once when they are imported.

The torch hooks (:mod:`shmsteer.torch_hook`, :mod:`shmsteer.device`, :mod:`shmsteer.ops`) use
``torch.library.custom_op`` and ``torch.compiler``, which torch 2.4 brought: an older torch is
refused with :class:`TorchVersionError` at import, not with an AttributeError deep in a forward.
The rest of the package (keys, vectors, the owner and clients) needs no torch at all.
"""

from __future__ import annotations

import re
from typing import Tuple

from .errors import ShmsteerError

#: The oldest torch the hooks run on (``pip install 'shmsteer[torch]'`` asks for it).
MIN_TORCH: Tuple[int, int] = (2, 4)


class TorchVersionError(ShmsteerError, ImportError):
    """The installed torch is older than :data:`MIN_TORCH`: the torch hooks cannot be imported."""


def torch_version(version: str) -> Tuple[int, int]:
    """(major, minor) of a torch version string (``"2.13.0+cpu"`` -> (2, 13))."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise TorchVersionError(f"shmsteer: cannot read torch's version {version!r}; the hooks need torch >= "
                                f"{MIN_TORCH[0]}.{MIN_TORCH[1]}")
    return int(m.group(1)), int(m.group(2))


def require_torch(version: str) -> None:
    """Refuse a torch older than :data:`MIN_TORCH` (``version`` is ``torch.__version__``)."""
    if torch_version(version) < MIN_TORCH:
        raise TorchVersionError(f"shmsteer: the torch hooks need torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} "
                                f"(torch.library.custom_op, torch.compile); this is torch {version}: "
                                "pip install 'torch>=2.4'")


__all__ = ["MIN_TORCH", "TorchVersionError", "require_torch", "torch_version"]
