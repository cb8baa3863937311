"""The C compiler's view of capi/shmsteer.h, and the comparison of ctypes types with it.

Used by test_abi.py. The header, with the headers of its own it includes (shmsteer_errors.h,
shmsteer_capture.h) inlined, is preprocessed by the C compiler (``cc -E``, its standard
``#include`` lines dropped so the standard typedefs stay names), then parsed: it is our own,
regular header, with typedef'd structs, opaque handle typedefs and plain function declarations.
The parse is then checked by the compiler itself (:func:`compiler_program` asserts every parsed
function type and field type with ``__builtin_types_compatible_p``) and the same program prints
``sizeof``, ``_Alignof`` and each field's ``offsetof``/``sizeof``.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.normpath(os.path.join(HERE, "..", "..", "capi", "shmsteer.h"))


class HeaderParseError(ValueError):
    """A declaration of the header this parser does not understand (extend the parser)."""


class CompilerError(RuntimeError):
    """The C compiler refused the layout program, or the program failed."""


@dataclass(frozen=True)
class CType:
    """A C type as declared: base name, pointer depth, const pointee, array dimensions."""

    base: str
    ptr: int = 0
    const: bool = False
    dims: Tuple[int, ...] = ()

    def pointee(self) -> "CType":
        return CType(self.base, self.ptr - 1, self.const, ())

    def element(self) -> "CType":
        return CType(self.base, self.ptr, self.const, self.dims[1:])

    def c(self, name: str = "") -> str:
        """The C spelling (abstract when name is empty)."""
        s = ("const " if self.const else "") + self.base + " " + "*" * self.ptr + name
        return s + "".join(f"[{d}]" for d in self.dims)

    def __str__(self) -> str:
        return self.c().strip()


@dataclass
class Function:
    name: str
    result: CType
    params: List[Tuple[str, CType]]


@dataclass
class Struct:
    name: str
    fields: List[Tuple[str, CType]]
    size: int = -1
    align: int = -1
    offsets: Dict[str, int] = field(default_factory=dict)
    sizes: Dict[str, int] = field(default_factory=dict)


@dataclass
class Header:
    functions: Dict[str, Function]
    structs: Dict[str, Struct]
    opaque: Dict[str, str]  # typedef name -> struct tag


_TOKEN = re.compile(r"[A-Za-z_]\w*|\*|\[\s*\d+\s*\]|\S")


def parse_declarator(text: str) -> Tuple[str, CType]:
    """``const float *data`` -> ("data", CType("float", 1, True)); an unnamed parameter gives
    the name ""."""
    toks = _TOKEN.findall(text)
    words: List[str] = []
    ptr, const, dims = 0, False, []
    for t in toks:
        if t == "const":
            const = const or ptr == 0  # a const after a * qualifies the pointer, not the pointee
        elif t == "*":
            ptr += 1
        elif t.startswith("["):
            dims.append(int(t[1:-1]))
        elif t == "struct":
            raise HeaderParseError(f"struct tag in a declaration (use the typedef): {text!r}")
        elif re.fullmatch(r"[A-Za-z_]\w*", t):
            words.append(t)
        else:
            raise HeaderParseError(f"cannot parse declaration {text!r}")
    if not words:
        raise HeaderParseError(f"no type in {text!r}")
    name = words.pop() if len(words) > 1 else ""
    return name, CType(" ".join(words), ptr, const, tuple(dims))


def _split_top(text: str, sep: str) -> List[str]:
    """Split at sep outside any (), {} or []."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [s.strip() for s in out if s.strip()]


def _struct_fields(body: str) -> List[Tuple[str, CType]]:
    fields: List[Tuple[str, CType]] = []
    for decl in _split_top(body, ";"):
        parts = _split_top(decl, ",")
        name, first = parse_declarator(parts[0])
        fields.append((name, first))
        base = ("const " if first.const else "") + first.base
        for more in parts[1:]:  # int64_t start, end;
            fields.append(parse_declarator(base + " " + more))
    return fields


def parse(preprocessed: str) -> Header:
    """Parse the preprocessed header's declarations."""
    hdr = Header({}, {}, {})
    text = " ".join(preprocessed.split())
    text = re.sub(r'extern\s+"C"\s*\{', "", text)
    for decl in _split_top(text, ";"):
        m = re.fullmatch(r"typedef struct (\w+) (\w+)", decl)
        if m:
            hdr.opaque[m.group(2)] = m.group(1)
            continue
        m = re.fullmatch(r"typedef struct \{(.*)\} (\w+)", decl, re.S)
        if m:
            hdr.structs[m.group(2)] = Struct(m.group(2), _struct_fields(m.group(1)))
            continue
        m = re.fullmatch(r"(.*?)\b(shmsteer_\w+)\s*\((.*)\)", decl, re.S)
        if m and not decl.startswith("typedef"):
            _, result = parse_declarator(m.group(1) + " _")
            params = [] if m.group(3).strip() in ("", "void") else [parse_declarator(p) for p in _split_top(m.group(3), ",")]
            hdr.functions[m.group(2)] = Function(m.group(2), result, params)
            continue
        if decl.strip() == "}":  # the extern "C" block's end
            continue
        raise HeaderParseError(f"a declaration the ABI check does not understand: {decl[:200]!r}")
    return hdr


def compiler() -> Optional[str]:
    """The C compiler: $CC, else gcc, else cc; None when there is none."""
    for c in (os.environ.get("CC", ""), "gcc", "cc"):
        if c and shutil.which(c):
            return shutil.which(c)
    return None


def _without_system_includes(path: str) -> str:
    """The text of header path with its ``#include "x"`` lines replaced by x's text (recursively,
    each file once, x beside path) and its ``#include <x>`` lines dropped, so the standard
    typedefs stay names: the parse sees ``uint32_t``, not what it expands to."""
    seen: set[str] = set()

    def expand(p: str) -> List[str]:
        p = os.path.normpath(p)
        if p in seen:
            return []
        seen.add(p)
        out: List[str] = []
        with open(p) as f:
            for line in f:
                m = re.match(r'\s*#\s*include\s*"([^"]+)"', line)
                if m:
                    out.extend(expand(os.path.join(os.path.dirname(p), m.group(1))))
                elif not re.match(r"\s*#\s*include\b", line):
                    out.append(line)
        return out

    return "".join(expand(path))


def preprocess(cc: str, header: str = HEADER) -> str:
    """The header, with the headers of its own it includes, through ``cc -E -P`` without the
    standard #include lines (see :func:`_without_system_includes`)."""
    src = _without_system_includes(header)
    r = subprocess.run([cc, "-E", "-P", "-x", "c", "-"], input=src, capture_output=True, text=True, check=False)
    if r.returncode:
        raise CompilerError(f"{cc} -E {header}: {r.stderr}")
    return r.stdout


def compiler_program(hdr: Header) -> str:
    """A C program that asserts the parse (every function's type, every field's type) and prints
    each struct's size and alignment and each field's offset and size."""
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "shmsteer.h"',
             "#define SAME(a, b) __builtin_types_compatible_p(a, b)"]
    for fn in hdr.functions.values():
        params = ", ".join(t.c(f"p{i}") for i, (_, t) in enumerate(fn.params)) or "void"
        lines.append(f"typedef {fn.result.c('')} (*ty_{fn.name})({params});")
        lines.append(f'_Static_assert(SAME(__typeof__(&{fn.name}), ty_{fn.name}), "parsed type of {fn.name}");')
    body = []
    for s in hdr.structs.values():
        body.append(f'  printf("S {s.name} %zu %zu\\n", sizeof({s.name}), _Alignof({s.name}));')
        for fname, t in s.fields:
            lines.append(f"typedef {t.c(f'ty_{s.name}__{fname}')};")
            lines.append(f"_Static_assert(SAME(__typeof__((({s.name} *)0)->{fname}), ty_{s.name}__{fname}), "
                         f'"parsed type of {s.name}.{fname}");')
            body.append(f'  printf("F {s.name} {fname} %zu %zu\\n", offsetof({s.name}, {fname}), '
                        f"sizeof((({s.name} *)0)->{fname}));")
    return "\n".join(lines + ["int main(void) {"] + body + ["  return 0;", "}", ""])


def compiler_view(cc: str, header: str = HEADER) -> Header:
    """The parsed header with every struct's layout filled in by the compiled program."""
    hdr = parse(preprocess(cc, header))
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "abi.c"), os.path.join(d, "abi")
        with open(src, "w") as f:
            f.write(compiler_program(hdr))
        r = subprocess.run([cc, "-std=gnu11", "-Wall", "-Werror", "-I", os.path.dirname(header), src, "-o", exe],
                           capture_output=True, text=True, check=False)
        if r.returncode:
            raise CompilerError(f"the layout program does not compile (the parse disagrees with the compiler):\n{r.stderr}")
        out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        kind, sname, *rest = line.split()
        s = hdr.structs[sname]
        if kind == "S":
            s.size, s.align = int(rest[0]), int(rest[1])
        else:
            s.offsets[rest[0]], s.sizes[rest[0]] = int(rest[1]), int(rest[2])
    return hdr


# ---- ctypes against C types --------------------------------------------------------------

_SCALARS = {"int": ctypes.c_int, "char": ctypes.c_char, "float": ctypes.c_float, "double": ctypes.c_double,
            "size_t": ctypes.c_size_t, "int8_t": ctypes.c_int8, "int16_t": ctypes.c_int16,
            "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "uint8_t": ctypes.c_uint8,
            "uint16_t": ctypes.c_uint16, "uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64}
_SIMPLE = type(ctypes.c_int)
_POINTER = type(ctypes.POINTER(ctypes.c_int))
_ARRAY = type(ctypes.c_int * 1)


def _scalar_kind(t: type) -> Optional[Tuple[str, int]]:
    """("signed"/"unsigned"/"float"/"char", size) of a ctypes scalar type; None for others."""
    code = getattr(t, "_type_", None)
    if not isinstance(t, _SIMPLE) or not isinstance(code, str):
        return None
    kinds = {**dict.fromkeys("bhilq", "signed"), **dict.fromkeys("BHILQ", "unsigned"),
             **dict.fromkeys("fdg", "float"), "c": "char", "?": "bool"}
    k = kinds.get(code)
    return (k, ctypes.sizeof(t)) if k else None


def type_name(t: object) -> str:
    """ctypes' type as one would write it: POINTER(c_float), c_uint8 * 32, None."""
    if t is None:
        return "None"
    if isinstance(t, _POINTER):
        return f"POINTER({type_name(t._type_)})"  # type: ignore[attr-defined]
    if isinstance(t, _ARRAY):
        return f"({type_name(t._type_)} * {t._length_})"  # type: ignore[attr-defined]
    return getattr(t, "__name__", repr(t))


def mismatch(c: CType, py: object, structs: Dict[str, type], opaque: Sequence[str]) -> Optional[str]:
    """Why ctypes type ``py`` does not pass or hold the C type ``c``; None when it does.

    ``structs`` maps a header struct's name to the ctypes Structure that mirrors it (a pointer to
    it must be POINTER(that class), a field of it that class). Accepted besides the exact type:
    ``c_void_p`` for any pointer (an address, untyped on the Python side), and ``c_char_p`` for a
    ``const char *`` or ``const void *`` (a read-only byte string in, or a C string out); a
    writable ``char *``/``void *`` buffer must not be a ``c_char_p`` (the library writes into it)."""
    if c.dims:
        if not isinstance(py, _ARRAY) or py._length_ != c.dims[0]:  # type: ignore[attr-defined]
            return f"a C array [{c.dims[0]}] needs a ctypes array of {c.dims[0]}"
        return mismatch(c.element(), py._type_, structs, opaque)  # type: ignore[attr-defined]
    if c.ptr == 0:
        if c.base == "void":
            return None if py is None else "a void result needs restype None"
        if c.base in structs:
            return None if py is structs[c.base] else f"{c.base} is mirrored by {structs[c.base].__name__}"
        if c.base in opaque:
            return f"{c.base} is opaque: only pointers to it exist"
        if c.base not in _SCALARS:
            return f"unknown C type {c.base}"
        want, got = _scalar_kind(_SCALARS[c.base]), _scalar_kind(py)  # type: ignore[arg-type]
        if got == want:
            return None
        have = f"{got[0]}, {got[1]} bytes" if got else "not a scalar"
        return f"{c.base} is {want[0]}, {want[1]} bytes; {type_name(py)} is {have}"  # type: ignore[index]
    if py is ctypes.c_void_p:
        return None
    if py is ctypes.c_char_p:
        if c.ptr == 1 and c.base in ("char", "void") and c.const:
            return None
        return "c_char_p only for a const char * or const void * (a writable buffer is c_void_p)"
    if isinstance(py, _POINTER):
        inner = c.pointee()
        if inner.ptr == 0 and inner.base == "void":
            return "a void * is c_void_p (or c_char_p when const)"
        if inner.ptr == 0 and inner.base in opaque:
            return f"a {inner.base} * handle is c_void_p"
        why = mismatch(inner, py._type_, structs, opaque)  # type: ignore[attr-defined]
        return None if why is None else f"pointee: {why}"
    return f"a pointer needs POINTER(...), c_void_p{' or c_char_p' if c.const else ''}"


def check_function(fn: Function, argtypes: Optional[Sequence[object]], restype: object,
                   structs: Dict[str, type], opaque: Sequence[str], restype_only: bool = False) -> List[str]:
    """Every drift of one prototype from fn's declaration, each naming the function."""
    out = []
    why = mismatch(fn.result, restype, structs, opaque)
    if why:
        out.append(f"{fn.name}: restype {type_name(restype)} for {fn.result}: {why}")
    if restype_only:
        return out
    if argtypes is None:
        return out + [f"{fn.name}: no argtypes (ctypes would convert its arguments by guess)"]
    if len(argtypes) != len(fn.params):
        return out + [f"{fn.name}: {len(argtypes)} argtypes, the header declares {len(fn.params)} parameters "
                      f"({', '.join(t.c(n) for n, t in fn.params) or 'void'})"]
    for i, ((pname, ct), py) in enumerate(zip(fn.params, argtypes)):
        why = mismatch(ct, py, structs, opaque)
        if why:
            out.append(f"{fn.name}: argument {i} ({ct.c(pname)}) is {type_name(py)}: {why}")
    return out


def check_struct(s: Struct, py: type, structs: Dict[str, type], opaque: Sequence[str]) -> List[str]:
    """Every drift of one ctypes Structure from the compiler's layout of s, each naming both."""
    who = f"{py.__module__}.{py.__qualname__} ({s.name})"
    out = []
    fields = list(py._fields_)  # type: ignore[attr-defined]
    cnames, pnames = [n for n, _ in s.fields], [f[0] for f in fields]
    if cnames != pnames:
        out.append(f"{who}: fields {pnames}, the header's are {cnames}")
    for fname, ptype, *_ in fields:
        ct = dict(s.fields).get(fname)
        if ct is None:
            continue
        off, size = getattr(py, fname).offset, getattr(py, fname).size
        if (off, size) != (s.offsets[fname], s.sizes[fname]):
            out.append(f"{who}.{fname}: offset {off} size {size}, the compiler's are "
                       f"{s.offsets[fname]} and {s.sizes[fname]}")
        why = mismatch(ct, ptype, structs, opaque)
        if why:
            out.append(f"{who}.{fname}: {type_name(ptype)} for {ct.c(fname)}: {why}")
    if (ctypes.sizeof(py), ctypes.alignment(py)) != (s.size, s.align):
        out.append(f"{who}: sizeof {ctypes.sizeof(py)} alignment {ctypes.alignment(py)}, the compiler's are "
                   f"{s.size} and {s.align}")
    return out
