"""shmsteer for Python: per-request keys and activation-steering vectors in one shared-memory
region, read lock-free by every worker process.

This package loads libshmsteer.so (the Go engine built as a C library by ``go generate ./capi``,
placed next to this file) with ctypes; it needs only the standard library and uses numpy and
torch when they are importable. The key get uses the ``_fastkeys`` extension that ``go generate
./capi`` builds beside the library when Python's headers are installed (see :mod:`shmsteer.keys`),
and a worker's per-step engine calls the ``_faststep`` one (see :mod:`shmsteer.device`); each
falls back to ctypes without it.

Start worker processes with the ``spawn`` start method: the Go runtime does not survive
``fork``, and every call in a child forked after the library was loaded raises
:class:`ForkedError`.

A worker::

    from shmsteer import Client
    with Client(namespace="llm") as c:          # secret from $SHMSTEER_SECRET
        key = c.keys["req-1"]                     # bytes; KeyRevokedError / KeyNotFoundError
        with c.snapshot() as snap:
            nv = snap.vector("honesty")           # a NamedVector (name, version, digest, entries)
            v = nv.entries[0].data                # a read-only numpy view of the mapping
"""

from . import errors
from ._version import __version__
from ._lib import PHASE_DECODE, PHASE_PREFILL
from .client import (Admitted, BadPhaseError, Client, Effective, Follower, ImportedVector, Keys, NamedVector, Owner,
                     Snapshot, Stepper, StepperBusyError, VectorEntry)
from .errors import *  # noqa: F401,F403 - the exception classes mirror the Go sentinels
from .errors import ShmsteerError
from .gates import check_gates

__all__ = ["__version__", "Client", "Owner", "Keys", "Snapshot", "NamedVector", "ImportedVector", "VectorEntry",
           "Stepper", "StepperBusyError", "Effective", "errors", "ShmsteerError", "PHASE_PREFILL", "PHASE_DECODE",
           "Admitted", "BadPhaseError", "check_gates"]
__all__ += [n for n in errors.__all__ if n not in __all__]
