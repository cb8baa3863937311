"""Exceptions mirroring the Go sentinel errors of shmsteer.

Every error code of ``shmsteer.h`` has one class here, named after its Go sentinel
(``ipc.ErrKeyRevoked`` -> :class:`KeyRevokedError`). All derive from :class:`ShmsteerError`;
several also derive from the built-in exception a Python caller would expect (a missing key is
a :class:`KeyError`, a bad argument a :class:`ValueError`, a dead owner a
:class:`ConnectionError`). Sentinels that match one another with ``errors.Is`` in Go are
subclasses here: :class:`IncompatibleError` (ipc) is a :class:`LayoutIncompatibleError` (shm), and
:class:`MarkedError` a :class:`NotFoundError`.
"""

from __future__ import annotations

import builtins
from typing import Dict, Tuple, Type


class ShmsteerError(Exception):
    """Base of every shmsteer error.

    Attributes:
        code: the ``SHMSTEER_E_*`` code of ``shmsteer.h``.
        go_name: the Go sentinel it mirrors, e.g. ``"ipc.ErrKeyRevoked"``.
    """

    code: int = 0
    go_name: str = ""

    def __str__(self) -> str:  # KeyError would otherwise repr() its message
        return str(self.args[0]) if self.args else self.go_name


# (code, Go sentinel, class name, extra built-in bases, parent shmsteer class or None)
_TABLE: Tuple[Tuple[int, str, str, Tuple[type, ...], str], ...] = (
    (1, "capi.ErrForked", "ForkedError", (), ""),
    (2, "capi.ErrBufferTooSmall", "BufferTooSmallError", (), ""),
    (3, "capi.ErrInvalidArgument", "InvalidArgumentError", (ValueError,), ""),
    (4, "capi.ErrBadHandle", "BadHandleError", (), ""),
    (5, "capi.ErrOther", "OtherError", (), ""),
    (10, "shm.ErrNotFound", "NotFoundError", (LookupError,), ""),
    (11, "shm.ErrRegionFull", "RegionFullError", (), ""),
    (12, "shm.ErrKeyTooLong", "KeyTooLongError", (ValueError,), ""),
    (13, "shm.ErrBadKind", "BadKindError", (ValueError,), ""),
    (14, "shm.ErrBadConfig", "RegionConfigError", (ValueError,), ""),
    (15, "shm.ErrNotRegion", "NotRegionError", (), ""),
    (16, "shm.ErrIncompatible", "LayoutIncompatibleError", (), ""),
    (17, "shm.ErrCorrupt", "CorruptError", (), ""),
    (18, "shm.ErrReadOnly", "ReadOnlyError", (), ""),
    (19, "shm.ErrBusy", "BusyError", (), ""),
    (20, "shm.ErrReaderBusy", "ReaderBusyError", (), ""),
    (21, "shm.ErrClosed", "ClosedError", (), ""),
    (22, "shm.ErrNoReaderSlot", "NoReaderSlotError", (), ""),
    (23, "shm.ErrSnapshotTooOld", "SnapshotTooOldError", (), ""),
    (24, "shm.ErrSnapshotFuture", "SnapshotFutureError", (), ""),
    (25, "shm.ErrValueTooLarge", "ValueTooLargeError", (ValueError,), ""),
    (26, "shm.ErrUnsupported", "UnsupportedError", (), ""),
    (27, "shm.ErrLeaseUnavailable", "LeaseUnavailableError", (), ""),
    (28, "shm.ErrMarked", "MarkedError", (), "NotFoundError"),
    (30, "ipc.ErrAuthSecretNotDefined", "AuthSecretNotDefinedError", (), ""),
    (31, "ipc.ErrNotYetInitialized", "NotYetInitializedError", (), ""),
    (32, "ipc.ErrPreviouslyInitialized", "PreviouslyInitializedError", (), ""),
    (33, "ipc.ErrAuthFailed", "AuthFailedError", (PermissionError,), ""),
    (34, "ipc.ErrOwnerGone", "OwnerGoneError", (ConnectionError,), ""),
    (35, "ipc.ErrTimeout", "OwnerTimeoutError", (builtins.TimeoutError,), ""),
    (36, "ipc.ErrIncompatible", "IncompatibleError", (), "LayoutIncompatibleError"),
    (37, "ipc.ErrKeyNotFound", "KeyNotFoundError", (KeyError,), ""),
    (38, "ipc.ErrKeyRevoked", "KeyRevokedError", (), ""),
    (39, "ipc.ErrRequestIDTooLong", "RequestIDTooLongError", (ValueError,), ""),
    (40, "ipc.ErrKeyTooLarge", "KeyTooLargeError", (ValueError,), ""),
    (41, "ipc.ErrFrameTooLarge", "FrameTooLargeError", (ValueError,), ""),
    (42, "ipc.ErrUnknownOp", "UnknownOpError", (), ""),
    (43, "ipc.ErrProtocol", "ProtocolError", (), ""),
    (44, "ipc.ErrSecretFile", "SecretFileError", (OSError,), ""),
    (45, "ipc.ErrSecretConflict", "SecretConflictError", (ValueError,), ""),
    (46, "ipc.ErrRendezvousTaken", "RendezvousTakenError", (), ""),
    (47, "ipc.ErrBusy", "OwnerBusyError", (ConnectionError,), ""),
    (48, "ipc.ErrDeadRegion", "DeadRegionError", (ConnectionError,), ""),
    (50, "steer.ErrIncompatible", "SteeringIncompatibleError", (), ""),
    (51, "steer.ErrBadConfig", "SteeringConfigError", (ValueError,), ""),
    (52, "steer.ErrBadName", "BadNameError", (ValueError,), ""),
    (53, "steer.ErrNonFinite", "NonFiniteError", (ValueError,), ""),
    (54, "steer.ErrHiddenSize", "HiddenSizeError", (ValueError,), ""),
    (55, "steer.ErrUnknownHook", "UnknownHookError", (ValueError,), ""),
    (56, "steer.ErrLayerRange", "LayerRangeError", (ValueError,), ""),
    (57, "steer.ErrDuplicate", "DuplicateError", (ValueError,), ""),
    (58, "steer.ErrEmptySet", "EmptySetError", (ValueError,), ""),
    (59, "steer.ErrBadClamp", "BadClampError", (ValueError,), ""),
    (60, "steer.ErrUnknownVector", "UnknownVectorError", (LookupError,), ""),
    (61, "steer.ErrBadRequestID", "BadRequestIDError", (ValueError,), ""),
    (62, "steer.ErrBadEncoding", "BadEncodingError", (), ""),
    (63, "steer.ErrNotOwner", "NotOwnerError", (), ""),
    (64, "steer.ErrNoStep", "NoStepError", (), ""),
    (65, "steer.ErrBadBatch", "BadBatchError", (ValueError,), ""),
    (66, "steer.ErrShape", "ShapeError", (ValueError,), ""),
    (69, "steer.ErrRemote", "RemoteError", (), ""),
    (70, "steer.ErrOverflow", "OverflowSteeringError", (ValueError,), ""),
    (71, "steer.ErrUnknownRequest", "UnknownRequestError", (LookupError,), ""),
    (72, "steer.ErrNotServed", "NotServedError", (), ""),
    (73, "steer.ErrLatchState", "LatchStateError", (ValueError,), ""),
    (74, "steer.ErrProbeSite", "ProbeSiteError", (ValueError,), ""),
    (80, "vecfile.ErrTooLarge", "VectorFileTooLargeError", (), "VectorFileError"),
    (81, "vecfile.ErrUnknownFormat", "UnknownFormatError", (), "VectorFileError"),
    (82, "vecfile.ErrCorrupt", "VectorFileCorruptError", (), "VectorFileError"),
    (83, "vecfile.ErrDtype", "DtypeError", (), "VectorFileError"),
    (84, "vecfile.ErrShape", "VectorFileShapeError", (), "VectorFileError"),
    (85, "vecfile.ErrValueRange", "ValueRangeError", (), "VectorFileError"),
    (86, "vecfile.ErrTensorName", "TensorNameError", (), "VectorFileError"),
    (87, "vecfile.ErrNeedLayers", "NeedLayersError", (), "VectorFileError"),
    (88, "vecfile.ErrNoVectors", "NoVectorsError", (), "VectorFileError"),
    (89, "vecfile.ErrUnrepresentable", "UnrepresentableError", (), "VectorFileError"),
    (90, "vecfile.ErrBadOptions", "VectorFileOptionsError", (), "VectorFileError"),
)


class VectorFileError(ShmsteerError, ValueError):
    """Base of the errors of package steer/vecfile (codes 80..99): a vector file that cannot be
    imported or exported. A ``ValueError``; the message names the file, the tensor and the
    expected shape. (A file whose tensor does not fit the model raises steer's class instead,
    e.g. :class:`HiddenSizeError`, as the C ABI reports steer's code first.)"""

BY_CODE: Dict[int, Type[ShmsteerError]] = {}
__all__ = ["ShmsteerError", "VectorFileError", "BY_CODE", "error_for"]

for _code, _go, _name, _extra, _parent in _TABLE:
    _base = globals()[_parent] if _parent else ShmsteerError
    _cls = type(_name, (_base, *_extra), {
        "code": _code,
        "go_name": _go,
        "__doc__": f"Mirrors Go's {_go} (code {_code} in shmsteer.h).",
        "__module__": __name__,
    })
    globals()[_name] = _cls
    BY_CODE[_code] = _cls
    __all__.append(_name)


def error_for(code: int, message: str) -> ShmsteerError:
    """The exception for a ``SHMSTEER_E_*`` code, carrying the library's message."""
    cls = BY_CODE.get(code, ShmsteerError)
    err = cls(message or cls.go_name or f"shmsteer error {code}")
    if cls is ShmsteerError:
        err.code = code
    return err
