"""The ctypes bindings against capi/shmsteer.h as the C compiler sees it (issue 39, item 5).

Every ctypes ``Structure`` of the package has the field names, types, offsets, size and
alignment of the header struct it mirrors (a small C program compiled from the header prints
``offsetof``/``sizeof``/``_Alignof``); every function the header declares has a Python prototype
whose argtypes and restype pass its C types (or is listed below with the reason it has none);
every prototype and every ``lib.``/``fast.`` call names a function the header declares. A drift
is silent memory corruption, so each is reported with the function or field it is about.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import pkgutil
import re
from types import ModuleType
from typing import Dict, List

import pytest

import shmsteer
from shmsteer import _lib

import abi_header as ah
from abi_header import CType, Function, Struct

#: Header struct -> the ctypes Structure mirroring it ("module:Class" in shmsteer). A new
#: Structure in the package must be listed here (test_every_structure_is_mapped).
STRUCTS = {
    "shmsteer_owner_config": "_lib:OwnerConfig",
    "shmsteer_vector_entry": "_lib:VectorEntry",
    "shmsteer_vector_info": "_lib:VectorInfo",
    "shmsteer_span": "_lib:Span",
    "shmsteer_effective": "_lib:EffectiveC",
    "shmsteer_step_stats": "_lib:StepStats",
    "shmsteer_capture_options": "_lib:CaptureOptionsC",
    "shmsteer_batch_options": "device:BatchOptionsC",
    "shmsteer_batch_gates": "device:BatchGatesC",
    "shmsteer_batch_info": "device:BatchInfoC",
    "shmsteer_batch_capture_plan": "device:BatchCapturePlanC",
    "shmsteer_capture_event": "capture:_Event",
    "shmsteer_capture_rec": "capture:_Rec",
    "shmsteer_capture_stats": "capture:_Stats",
    "shmsteer_capture_fs_options": "capture:_FSOptions",
    "shmsteer_capture_fs_stats": "capture:_FSStats",
    "shmsteer_admitted": "_lib:AdmittedC",
    "shmsteer_admit_vector": "_lib:AdmitVectorC",
    "shmsteer_admit_clamp": "_lib:AdmitClampC",
}

#: Header structs Python does not mirror, and why.
UNMIRRORED_STRUCTS = {
    "shmsteer_key_get_item": "only shmsteer_reader_key_get_many takes it, which Python does not call",
}

#: Header functions with no ctypes prototype on shmsteer._lib.lib, and why.
UNBOUND = {
    "shmsteer_reader_key_get_many": "a C caller's batch get: Python gets keys one at a time (shmsteer.keys)",
    "shmsteer_reader_key_get": "called by the _fastkeys extension through __typeof__(&shmsteer_reader_key_get) "
                               "(compiled against the header); Python only takes its address",
    "shmsteer_key_get_tls": "called through shmsteer._lib.fast (PyDLL, pre-converted arguments): restype only",
    "shmsteer_reader_key_get_tls": "called through shmsteer._lib.fast (PyDLL, pre-converted arguments): restype only",
}

#: Functions reached through shmsteer._lib.fast: restype set, argtypes deliberately not (the
#: callers pass ctypes objects; see _lib.fast's comment).
FAST_RESTYPE_ONLY = ("shmsteer_key_get", "shmsteer_key_get_tls", "shmsteer_reader_key_get_tls")

PKG_DIR = os.path.dirname(os.path.abspath(shmsteer.__file__))


@pytest.fixture(scope="module")
def header() -> ah.Header:
    cc = ah.compiler()
    if cc is None:
        pytest.skip("no C compiler (gcc, cc or $CC): the ABI check compiles a program from shmsteer.h")
    return ah.compiler_view(cc)


def _package_modules() -> Dict[str, ModuleType]:
    """Every shmsteer submodule, imported (so every prototype set at import is set)."""
    mods = {"": shmsteer}
    for info in pkgutil.iter_modules([PKG_DIR]):
        if not os.path.exists(os.path.join(PKG_DIR, info.name + ".py")):
            continue  # libshmsteer.so, the _fastkeys and _faststep extensions: no ctypes declarations
        try:
            mods[info.name] = importlib.import_module(f"shmsteer.{info.name}")
        except ModuleNotFoundError as e:
            if e.name and e.name.split(".")[0] == "shmsteer":
                raise
            # An optional third-party dependency (transformers, ...) missing here: its module's
            # prototypes, if any, cannot be set, and the source scan below still covers its calls.
            continue
    return mods


def _mirrors(mods: Dict[str, ModuleType]) -> Dict[str, type]:
    out = {}
    for cname, ref in STRUCTS.items():
        mod, cls = ref.split(":")
        out[cname] = getattr(mods[mod], cls)
    return out


def test_header_parse_is_the_compilers(header):
    """The parse saw every declaration (the compiled program asserts each parsed type): the
    header has its ~75 functions and ~15 structs, each struct laid out."""
    assert len(header.functions) >= 70, sorted(header.functions)
    assert len(header.structs) >= 14, sorted(header.structs)
    assert {"shmsteer_t", "shmsteer_stepper_t", "shmsteer_batch_t", "shmsteer_capture_t"} <= set(header.opaque)
    for s in header.structs.values():
        assert s.size > 0 and set(s.offsets) == {n for n, _ in s.fields}, s.name
    span = header.structs["shmsteer_span"]
    assert [n for n, _ in span.fields] == ["id", "id_len", "start", "end", "phase", "first_position"]
    assert span.fields[0][1] == CType("char", 1, True)
    assert header.structs["shmsteer_step_stats"].fields[8][1].dims == (4, 3)
    apply = header.functions["shmsteer_stepper_apply"]
    assert [str(t) for _, t in apply.params] == ["shmsteer_stepper_t *", "uint32_t", "int32_t", "float *", "size_t",
                                                "const shmsteer_span *", "size_t"]


def test_structures_match_header(header):
    mods = _package_modules()
    mirrors = _mirrors(mods)
    drifts: List[str] = []
    for cname, py in mirrors.items():
        s = header.structs.get(cname)
        if s is None:
            drifts.append(f"{py.__qualname__} mirrors {cname}, which the header does not declare")
            continue
        drifts += ah.check_struct(s, py, mirrors, list(header.opaque))
    unlisted = set(header.structs) - set(STRUCTS) - set(UNMIRRORED_STRUCTS)
    for cname in sorted(unlisted):
        drifts.append(f"{cname}: a header struct neither mirrored (STRUCTS) nor listed in UNMIRRORED_STRUCTS of test_abi.py")
    assert not drifts, "ctypes Structures drifted from shmsteer.h:\n" + "\n".join(drifts)


def test_every_structure_is_mapped():
    """A ctypes Structure the package defines is checked: it is in STRUCTS."""
    mods = _package_modules()
    mapped = {id(c) for c in _mirrors(mods).values()}
    found = []
    for name, mod in mods.items():
        for attr, obj in vars(mod).items():
            if isinstance(obj, type) and issubclass(obj, ctypes.Structure) and obj.__module__ == mod.__name__:
                if id(obj) not in mapped:
                    found.append(f"{mod.__name__}.{attr}")
    assert not found, f"ctypes Structures with no header struct in STRUCTS of test_abi.py: {found}"


def _prototypes() -> Dict[str, object]:
    """The package's ctypes function objects on _lib.lib, after importing every module."""
    _package_modules()
    return {n: f for n, f in vars(_lib.lib).items() if n.startswith("shmsteer_")}


def test_prototypes_match_header(header):
    structs = _mirrors(_package_modules())
    opaque = list(header.opaque)
    protos = _prototypes()
    drifts: List[str] = []
    for name, fn in sorted(protos.items()):
        decl = header.functions.get(name)
        if decl is None:
            drifts.append(f"{name}: a Python prototype for a function shmsteer.h does not declare")
        elif name in UNBOUND:
            if fn.argtypes is not None:  # type: ignore[attr-defined]
                drifts.append(f"{name}: listed in UNBOUND but has a prototype: remove it from UNBOUND")
        else:
            drifts += ah.check_function(decl, fn.argtypes, fn.restype, structs, opaque)  # type: ignore[attr-defined]
    for name in sorted(set(header.functions) - set(protos) - set(UNBOUND)):
        drifts.append(f"{name}: declared in shmsteer.h, no ctypes prototype (bind it, or list it in UNBOUND of test_abi.py)")
    for name in sorted(set(UNBOUND) - set(header.functions)):
        drifts.append(f"{name}: listed in UNBOUND, not declared in shmsteer.h")
    assert not drifts, "ctypes prototypes drifted from shmsteer.h:\n" + "\n".join(drifts)


def test_fast_restypes_match_header(header):
    structs = _mirrors(_package_modules())
    drifts: List[str] = []
    for name in FAST_RESTYPE_ONLY:
        fn = getattr(_lib.fast, name)
        drifts += ah.check_function(header.functions[name], None, fn.restype, structs, list(header.opaque),
                                    restype_only=True)
    assert not drifts, "\n".join(drifts)


_CALL = re.compile(r"\b(?:lib|fast)\.(shmsteer_\w+)|[\"'](shmsteer_[a-z0-9_]+)[\"']")


def test_every_named_function_is_declared(header):
    """Each ``lib.shmsteer_x``/``fast.shmsteer_x`` and each quoted "shmsteer_x" in the package's
    source names a declared function (or a header struct), and each lib. call is prototyped at
    import (or listed in UNBOUND): a call made before its prototype is set guesses its types."""
    protos = _prototypes()
    missing, unprototyped = [], []
    for fname in sorted(os.listdir(PKG_DIR)):
        if not fname.endswith(".py"):
            continue
        with open(os.path.join(PKG_DIR, fname)) as f:
            src = f.read()
        for m in _CALL.finditer(src):
            name = m.group(1) or m.group(2)
            if name not in header.functions and name not in header.structs and name not in header.opaque:
                missing.append(f"{fname}: {name}")
            elif m.group(0).startswith("lib.") and name not in UNBOUND:
                fn = protos.get(name)
                if fn is None or fn.argtypes is None:  # type: ignore[attr-defined]
                    unprototyped.append(f"{fname}: {name}")
    assert not missing, f"names shmsteer.h does not declare: {missing}"
    assert not unprototyped, f"lib calls with no prototype set at import: {unprototyped}"


# ---- the check itself fails on a drift ------------------------------------------------------


def test_check_reports_struct_drift(header):
    """A Span whose phase is 64-bit, or whose fields are reordered, is reported by field."""
    s = header.structs["shmsteer_span"]
    good = [f for f in _lib.Span._fields_]

    class Wide(ctypes.Structure):
        _fields_ = [(n, ctypes.c_int64 if n == "phase" else t) for n, t in good]

    class Signless(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint64 if n == "start" else t) for n, t in good]

    class Swapped(ctypes.Structure):
        _fields_ = [good[1], good[0]] + good[2:]

    structs = _mirrors(_package_modules())
    wide = ah.check_struct(s, Wide, structs, list(header.opaque))
    assert any(".phase: offset 32 size 8" in d for d in wide), wide
    assert any("sizeof 48" in d for d in wide), wide
    assert any(".phase: c_long for int32_t phase" in d or ".phase: c_int64 for int32_t phase" in d for d in wide), wide
    signless = ah.check_struct(s, Signless, structs, list(header.opaque))
    assert signless and all("start" in d and "int64_t is signed" in d for d in signless), signless
    assert any("fields ['id_len', 'id'" in d for d in ah.check_struct(s, Swapped, structs, list(header.opaque)))
    assert ah.check_struct(s, _lib.Span, structs, list(header.opaque)) == []


def test_check_reports_prototype_drift(header):
    """Each kind of argtype or restype drift is reported with the function and argument."""
    structs = _mirrors(_package_modules())
    opaque = list(header.opaque)
    fn = header.functions["shmsteer_stepper_apply"]
    good = list(_lib.lib.shmsteer_stepper_apply.argtypes)
    assert ah.check_function(fn, good, ctypes.c_int, structs, opaque) == []
    cases = {
        3: (ctypes.POINTER(ctypes.c_int32), "argument 3 (float *rows) is POINTER(c_int)"),
        1: (ctypes.c_int32, "argument 1 (uint32_t hook) is c_int: uint32_t is unsigned, 4 bytes; c_int is signed, 4 bytes"),
        4: (ctypes.c_int32, "argument 4 (size_t n_floats) is c_int"),
        5: (ctypes.POINTER(_lib.VectorEntry), "argument 5 (const shmsteer_span *spans) is POINTER(VectorEntry)"),
        0: (ctypes.POINTER(ctypes.c_void_p), "argument 0 (shmsteer_stepper_t *st)"),
    }
    for i, (bad, want) in cases.items():
        args = list(good)
        args[i] = bad
        got = ah.check_function(fn, args, ctypes.c_int, structs, opaque)
        assert len(got) == 1 and got[0].startswith("shmsteer_stepper_apply: ") and want in got[0], (i, got)
    extra = ah.check_function(fn, good + [ctypes.c_int], ctypes.c_int, structs, opaque)
    assert len(extra) == 1 and "8 argtypes, the header declares 7 parameters" in extra[0], extra
    assert "restype c_long" in ah.check_function(fn, good, ctypes.c_int64, structs, opaque)[0]
    status = header.functions["shmsteer_status_json"]  # char *buf: the library writes it
    args = list(_lib.lib.shmsteer_status_json.argtypes)
    args[1] = ctypes.c_char_p
    assert "writable buffer" in ah.check_function(status, args, ctypes.c_int, structs, opaque)[0]


def test_parse_declarator():
    assert ah.parse_declarator("const float *data") == ("data", CType("float", 1, True))
    assert ah.parse_declarator("shmsteer_t **out") == ("out", CType("shmsteer_t", 2))
    assert ah.parse_declarator("uint64_t gate_scopes[4][3]") == ("gate_scopes", CType("uint64_t", 0, False, (4, 3)))
    assert ah.parse_declarator("const char *") == ("", CType("char", 1, True))
    with pytest.raises(ah.HeaderParseError):
        ah.parse_declarator("struct shmsteer *h")
    fn = ah.parse("int64_t shmsteer_x(shmsteer_t *h, const char *id); void *shmsteer_y(void);").functions
    assert fn["shmsteer_x"].result == CType("int64_t") and fn["shmsteer_y"].params == []
    assert fn["shmsteer_y"].result == CType("void", 1)
    with pytest.raises(ah.HeaderParseError):
        ah.parse("enum { A, B } thing;")


def test_unknown_function_reported():
    fn = Function("shmsteer_z", CType("int"), [("h", CType("shmsteer_t", 1))])
    got = ah.check_function(fn, None, ctypes.c_int, {}, ["shmsteer_t"])
    assert got == ["shmsteer_z: no argtypes (ctypes would convert its arguments by guess)"]
    s = Struct("x", [("a", CType("uint32_t"))], 4, 4, {"a": 0}, {"a": 4})

    class X(ctypes.Structure):
        _fields_ = [("a", ctypes.c_uint32)]
    assert ah.check_struct(s, X, {}, []) == []
