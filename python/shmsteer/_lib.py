"""ctypes bindings of libshmsteer.so (the C ABI in shmsteer.h, ABI version ABI_VERSION).

The library is looked up in ``$SHMSTEER_LIB`` when set, else next to this file (where
``go generate ./capi`` puts it). Every binding returns the C status; :func:`check` turns a
non-zero status into the matching exception of :mod:`shmsteer.errors`.
"""

from __future__ import annotations

import ctypes
import importlib
import os
from typing import Any, Tuple
from ctypes import (POINTER, Structure, c_char, c_char_p, c_float, c_int, c_int32, c_int64,
                    c_size_t, c_uint8, c_uint32, c_uint64, c_void_p)

from .errors import BufferTooSmallError, error_for

ABI_VERSION = 4
PHASE_PREFILL = 1
PHASE_DECODE = 2
#: shmsteer_admit_vector.tier: SHMSTEER_TIER_BASE, _PREFILL, _DECODE.
TIER_BASE, TIER_PREFILL, TIER_DECODE = 0, 1, 2
#: Set (not "0") to resolve steps through ctypes, not the ``shmsteer._faststep`` extension.
STEP_CTYPES_ENV = "SHMSTEER_STEP_CTYPES"
#: shmsteer_follow flag: switch to a restarted owner once `shmsteer serve` restored its state.
FOLLOW_READY_SERVE = 1


class OwnerConfig(Structure):
    _fields_ = [("hidden", c_int32), ("layers", c_int32), ("hooks", c_char_p),
                ("index_slots", c_int64), ("arena_bytes", c_int64), ("reader_slots", c_int64),
                ("grace_ms", c_int64), ("max_key_bytes", c_int64)]


class VectorEntry(Structure):
    _fields_ = [("hook", c_uint32), ("layer", c_int32), ("scale", c_float),
                ("data", POINTER(c_float)), ("len", c_size_t)]


class VectorInfo(Structure):
    _fields_ = [("version", c_uint64), ("digest", c_uint8 * 32), ("n_entries", c_size_t)]


class StepStats(Structure):
    """shmsteer_step_stats."""

    _fields_ = [("steps", c_uint64), ("applies", c_uint64), ("recomposes", c_uint64), ("missing_refs", c_uint64),
                ("unknown_requests", c_uint64), ("gate_evaluations", c_uint64), ("gate_fires", c_uint64),
                ("gate_reports_missed", c_uint64), ("gate_scopes", (c_uint64 * 3) * 4), ("gate_checksum", c_uint64)]


class Span(Structure):
    """shmsteer_span: first_position is the absolute position of row start (capture reads it)."""

    _fields_ = [("id", c_char_p), ("id_len", c_size_t), ("start", c_int64), ("end", c_int64),
                ("phase", c_int32), ("first_position", c_int32)]


class AdmittedC(Structure):
    """shmsteer_admitted: what an admission did (steer.Admitted)."""

    _fields_ = [("version", c_uint64), ("source", c_int32), ("latched", c_uint8), ("refused", c_uint8),
                ("replaced", c_uint8), ("reserved", c_uint8), ("digest", c_uint8 * 32)]


class AdmitVectorC(Structure):
    """shmsteer_admit_vector: an override's inline vector passed by address."""

    _fields_ = [("tier", c_uint32), ("hook", c_uint32), ("layer", c_int32), ("scale", c_float),
                ("data", POINTER(c_float)), ("len", c_size_t)]


class AdmitClampC(Structure):
    """shmsteer_admit_clamp: an override's clamp, its direction passed by address."""

    _fields_ = [("tier", c_uint32), ("hook", c_uint32), ("layer", c_int32), ("min", c_float), ("max", c_float),
                ("strength", c_float), ("dir", POINTER(c_float)), ("len", c_size_t)]


class CaptureOptionsC(Structure):
    """shmsteer_capture_options."""

    _fields_ = [("ring_bytes", c_uint64), ("wait_ns", c_int64), ("rank", c_int32), ("writer_rank", c_int32)]


class EffectiveC(Structure):
    _fields_ = [("data", POINTER(c_float)), ("len", c_size_t), ("global_data", POINTER(c_float)),
                ("clamps", c_uint32), ("version", c_uint64), ("digest", c_uint8 * 32)]


def _path() -> str:
    env = os.environ.get("SHMSTEER_LIB")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libshmsteer.so")


def _load() -> ctypes.CDLL:
    path = _path()
    if not os.path.exists(path):
        raise ImportError(
            f"libshmsteer.so not found at {path}: build it with `go generate ./capi` in the "
            "shmsteer repository (or set SHMSTEER_LIB to its path)")
    lib = ctypes.CDLL(path)
    P = POINTER
    h = c_void_p  # opaque handles
    sigs = {
        "shmsteer_abi_version": (c_int, []),
        "shmsteer_last_error": (c_char_p, []),
        "shmsteer_error_name": (c_char_p, [c_int]),
        "shmsteer_attach": (c_int, [c_char_p, c_char_p, c_size_t, c_char_p, c_int64, P(h)]),
        "shmsteer_owner_start": (c_int, [c_char_p, c_char_p, c_size_t, c_char_p, P(OwnerConfig), P(h)]),
        "shmsteer_close": (c_int, [h]),
        "shmsteer_ping": (c_int, [h]),
        "shmsteer_follow": (c_int, [c_char_p, c_char_p, c_size_t, c_char_p, c_int64, c_int64, c_uint32, P(h)]),
        "shmsteer_follower_client": (c_int, [h, P(h), P(c_uint64), P(c_int)]),
        "shmsteer_follower_close": (c_int, [h]),
        "shmsteer_model": (c_int, [h, P(c_int32), P(c_int32), P(c_int32)]),
        "shmsteer_hook_id": (c_int, [h, c_char_p, P(c_uint32)]),
        "shmsteer_version": (c_int, [h, P(c_uint64)]),
        "shmsteer_status_json": (c_int, [h, c_void_p, c_size_t, P(c_size_t)]),
        "shmsteer_key_get": (c_int, [h, c_char_p, c_size_t, c_void_p, c_size_t, P(c_size_t)]),
        "shmsteer_reader_open": (c_int, [h, P(h)]),
        "shmsteer_reader_close": (c_int, [h]),
        "shmsteer_key_set": (c_int, [h, c_char_p, c_size_t, c_char_p, c_size_t]),
        "shmsteer_key_remove": (c_int, [h, c_char_p, c_size_t]),
        "shmsteer_key_list_json": (c_int, [h, c_void_p, c_size_t, P(c_size_t)]),
        "shmsteer_snapshot_open": (c_int, [h, c_uint64, P(h), P(c_uint64)]),
        "shmsteer_snapshot_close": (c_int, [h]),
        "shmsteer_vector_view": (c_int, [h, c_char_p, c_size_t, P(VectorInfo), P(VectorEntry), c_size_t]),
        "shmsteer_vector_list_json": (c_int, [h, c_void_p, c_size_t, P(c_size_t)]),
        "shmsteer_vector_register": (c_int, [h, c_char_p, c_size_t, P(VectorEntry), c_size_t, P(c_uint64)]),
        "shmsteer_vector_unregister": (c_int, [h, c_char_p, c_size_t, P(c_uint64)]),
        "shmsteer_probe_view": (c_int, [h, c_char_p, c_size_t, P(VectorInfo), P(VectorEntry), c_size_t]),
        "shmsteer_probe_list_json": (c_int, [h, c_void_p, c_size_t, P(c_size_t)]),
        "shmsteer_probe_register": (c_int, [h, c_char_p, c_size_t, P(VectorEntry), c_size_t, P(c_uint64)]),
        "shmsteer_probe_unregister": (c_int, [h, c_char_p, c_size_t, P(c_uint64)]),
        "shmsteer_vector_import": (c_int, [h, c_char_p, c_size_t, c_char_p, c_char_p, c_size_t, P(c_uint64),
                                           P(c_uint8)]),
        "shmsteer_vector_import_bytes": (c_int, [h, c_char_p, c_size_t, c_char_p, c_size_t, c_char_p, c_char_p,
                                                 c_size_t, P(c_uint64), P(c_uint8)]),
        "shmsteer_vector_export": (c_int, [h, c_char_p, c_size_t, c_char_p, c_char_p, c_char_p]),
        "shmsteer_vector_model_hint": (c_int, [h, c_char_p, c_size_t, c_void_p, c_size_t, P(c_size_t)]),
        "shmsteer_global_set_json": (c_int, [h, c_char_p, c_size_t, P(c_uint64)]),
        "shmsteer_gates_check": (c_int, [c_char_p, c_size_t, P(c_size_t)]),
        "shmsteer_gates_check_at": (c_int, [h, c_char_p, c_size_t, c_char_p, c_size_t, P(c_size_t)]),
        "shmsteer_request_admit_json": (c_int, [h, c_char_p, c_size_t, c_char_p, c_size_t, P(c_uint64)]),
        "shmsteer_request_admit_result": (c_int, [h, c_char_p, c_size_t, c_char_p, c_size_t, P(AdmittedC)]),
        "shmsteer_request_admit_binary": (c_int, [h, c_char_p, c_size_t, c_char_p, c_size_t, P(AdmitVectorC), c_size_t,
                                                  P(AdmittedC)]),
        "shmsteer_request_admit_buffers": (c_int, [h, c_char_p, c_size_t, c_char_p, c_size_t, P(AdmitVectorC), c_size_t,
                                                   P(AdmitClampC), c_size_t, P(AdmittedC)]),
        "shmsteer_request_end": (c_int, [h, c_char_p, c_size_t, P(c_uint64)]),
        "shmsteer_stepper_new": (c_int, [h, P(h)]),
        "shmsteer_stepper_free": (c_int, [h]),
        "shmsteer_stepper_set_strict": (c_int, [h, c_int32]),
        "shmsteer_stepper_begin": (c_int, [h, c_uint64, P(c_uint64)]),
        "shmsteer_stepper_apply": (c_int, [h, c_uint32, c_int32, c_void_p, c_size_t, P(Span), c_size_t]),
        "shmsteer_stepper_bind": (c_int, [h, P(Span), c_size_t, c_size_t]),
        "shmsteer_stepper_apply_bf16": (c_int, [h, c_uint32, c_int32, c_void_p, c_size_t, P(Span), c_size_t]),
        "shmsteer_stepper_apply_bound": (c_int, [h, c_uint32, c_int32, c_void_p, c_size_t]),
        "shmsteer_stepper_effective": (c_int, [h, c_char_p, c_size_t, c_uint32, c_int32, c_int32, P(EffectiveC)]),
        "shmsteer_stepper_end": (c_int, [h, P(c_uint64)]),
        "shmsteer_stepper_stats": (c_int, [h, P(StepStats)]),
        "shmsteer_stepper_report_gates": (c_int, [h, c_char_p, c_size_t]),
        "shmsteer_stepper_capture_start": (c_int, [h, P(CaptureOptionsC)]),
        "shmsteer_stepper_capture_stop": (c_int, [h]),
        "shmsteer_stepper_capture": (c_int, [h, c_uint32, c_int32, c_void_p, c_size_t, c_int32, P(Span), c_size_t]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    got = lib.shmsteer_abi_version()
    if got != ABI_VERSION:
        raise ImportError(f"{path} has ABI version {got}, this package needs {ABI_VERSION}: rebuild it")
    return lib


lib = _load()

#: The same library through ctypes.PyDLL: calls keep the GIL (saving its release and
#: re-acquisition, about a third of a short call) and take pre-converted ctypes arguments (no
#: argtypes). Only for calls that never block: key gets.
fast = ctypes.PyDLL(lib._name)
fast.shmsteer_key_get.restype = c_int
fast.shmsteer_key_get_tls.restype = c_int64
fast.shmsteer_reader_key_get_tls.restype = c_int64
lib.shmsteer_key_buffer.restype = c_void_p
lib.shmsteer_key_buffer.argtypes = []
KEY_BUFFER_BYTES = 8192


def last_error() -> str:
    """The calling thread's last error message from the library."""
    msg = lib.shmsteer_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def check(rc: int) -> None:
    """Raise the exception for a non-zero status."""
    if rc:
        raise error_for(rc, last_error())


def error_name(code: int) -> str:
    """The Go sentinel name of a code, per the library."""
    n = lib.shmsteer_error_name(code)
    return n.decode() if n else ""


def read_json(fn, handle) -> bytes:
    """Call a *_json function, growing the buffer when it reports the size needed."""
    cap = 4096
    while True:
        buf = ctypes.create_string_buffer(cap)
        n = c_size_t(0)
        rc = fn(handle, buf, cap, ctypes.byref(n))
        if rc == BufferTooSmallError.code and n.value > cap:
            cap = n.value
            continue
        check(rc)
        return buf.raw[: n.value]


__all__ = ["lib", "fast", "check", "last_error", "error_name", "read_json", "OwnerConfig", "VectorEntry",
           "VectorInfo", "Span", "AdmittedC", "AdmitVectorC", "AdmitClampC", "CaptureOptionsC", "EffectiveC", "PHASE_PREFILL",
           "PHASE_DECODE", "TIER_BASE", "TIER_PREFILL", "TIER_DECODE", "ABI_VERSION", "c_char"]


def extension(name: str, env: str) -> Tuple[Any, str]:
    """(the package's C extension ``name``, "") or (None, why the ctypes path is used): ``$env``
    set (not "0"), the extension not built, or built for another interpreter."""
    if os.environ.get(env, "") not in ("", "0"):
        return None, f"${env} is set"
    try:
        return importlib.import_module(f"{__package__}.{name}"), ""
    except ModuleNotFoundError:
        return None, f"shmsteer.{name} is not built: `go generate ./capi` builds it when python3-dev is installed"
    except ImportError as e:  # built for another interpreter, say
        return None, f"shmsteer.{name} does not load ({e}): rebuild it with `go generate ./capi`"


def faststep(info_bytes: int) -> Tuple[Any, str]:
    """(the ``shmsteer._faststep`` extension, bound to this library, "") or (None, why a step's
    resolve, report and native applies use ctypes). ``info_bytes``: ctypes' size of shmsteer_batch_info,
    which must be the extension's."""
    mod, why = extension("_faststep", STEP_CTYPES_ENV)
    if mod is None:
        return None, why
    if mod.INFO_BYTES != info_bytes:
        return None, (f"shmsteer._faststep was built for a shmsteer_batch_info of {mod.INFO_BYTES} bytes, "
                      f"not {info_bytes}: rebuild it (go generate ./capi)")
    mod.bind(*(ctypes.cast(getattr(lib, f), c_void_p).value for f in (
        "shmsteer_batch_resolve", "shmsteer_batch_report", "shmsteer_stepper_apply", "shmsteer_stepper_apply_bf16",
        "shmsteer_stepper_end")))
    return mod, ""
