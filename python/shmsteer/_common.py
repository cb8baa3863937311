"""Argument conversion and handle plumbing shared by the client and the stepper modules: the
phases a span may name, the integer ranges of the C ABI, and a finalizer's quiet close."""

from __future__ import annotations

import numbers
from typing import Any, Dict, Tuple, Union

from . import _lib
from .errors import InvalidArgumentError


class BadPhaseError(InvalidArgumentError, KeyError):
    """A span's phase is not ``"prefill"``, ``"decode"``, ``PHASE_PREFILL`` or ``PHASE_DECODE``.
    An :class:`~shmsteer.errors.InvalidArgumentError` (and, as before, a ``KeyError``)."""


class _Phases(Dict[Any, int]):
    def __missing__(self, phase: Any) -> int:
        raise BadPhaseError(f"shmsteer: invalid argument: phase {phase!r}: want \"prefill\", \"decode\", "
                            f"PHASE_PREFILL ({_lib.PHASE_PREFILL}) or PHASE_DECODE ({_lib.PHASE_DECODE})")


PHASES = _Phases({"prefill": _lib.PHASE_PREFILL, "decode": _lib.PHASE_DECODE,
                  _lib.PHASE_PREFILL: _lib.PHASE_PREFILL, _lib.PHASE_DECODE: _lib.PHASE_DECODE})


def _b(s: Union[str, bytes]) -> bytes:
    return s if isinstance(s, bytes) else s.encode()


# The ranges of the C ABI's integer arguments: ctypes would silently keep only the low bits.
I32 = (-(1 << 31), (1 << 31) - 1)
U32 = (0, (1 << 32) - 1)
I64 = (-(1 << 63), (1 << 63) - 1)
U64 = (0, (1 << 64) - 1)


def _int(what: str, v: Any, bounds: Tuple[int, int]) -> int:
    """``v`` as an int within ``bounds`` (inclusive), or InvalidArgumentError naming ``what``.

    Integers of any kind (numpy's too) are accepted; bool, floats and other types are not."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise InvalidArgumentError(f"shmsteer: invalid argument: {what} must be an integer, not "
                                   f"{type(v).__name__}")
    i = int(v)
    lo, hi = bounds
    if not lo <= i <= hi:
        raise InvalidArgumentError(f"shmsteer: invalid argument: {what} {i} is outside [{lo}, {hi}]")
    return i


def _quiet_close(fn, handle) -> None:
    """Release a handle from a finalizer: errors (a forked child, a closed owner) are moot."""
    try:
        fn(handle)
    except Exception:  # pragma: no cover - finalizers must not raise
        pass
