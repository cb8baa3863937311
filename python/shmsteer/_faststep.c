/* _faststep: a worker's engine calls per step as CPython methods: on the device path the
 * resolve (shmsteer_batch_resolve) and the report of a step with probe gates
 * (shmsteer_batch_report), with the comparison of the resolve's answer with the last one; on
 * the native path the resolve that begins the step (SHMSTEER_BATCH_NATIVE), each site's apply
 * (shmsteer_stepper_apply, shmsteer_stepper_apply_bf16) and the end (shmsteer_stepper_end). A
 * steady decode step then runs no ctypes call and builds no Python object of the answer.
 *
 * It calls the exported C ABI only (shmsteer.h: those five functions),
 * through the function pointers shmsteer._lib hands to bind() from the library it loaded with
 * ctypes (one copy of libshmsteer.so, the one whose ABI version _lib checked). It knows nothing
 * of the engine: the library answers; this file only compares answers.
 *
 * A Resolver belongs to one shmsteer.device.StepBatch, which keeps everything else: the
 * stepper's one-thread guard, the error mapping (an error code comes back as it is and the
 * caller raises from the thread's last error), the Resolved views. Resolver.resolve(version,
 * spans, n, rows, flags) calls the library with the GIL released (as ctypes.CDLL does: a
 * resolve may enter Go and build the step's tables) into the caller's shmsteer_batch_info
 * (the ctypes structure StepBatch owns, passed by address once), then returns
 *   a positive error code (nothing compared or kept: the next success is compared with the
 *     last success, as the ctypes path does),
 *   CHANGED (0): the answer's buffers or counts differ from the last success's, or
 *   SAME (-1): every field but version and checksum is the last success's: the same buffers
 *     and counts (whose content the library may have rewritten), so the caller's views of the
 *     last answer are this one's.
 * Resolver.report(scores, n) calls shmsteer_batch_report on n float32 scores at the address
 * scores (0: none), the GIL released, and returns (error code, gate checksum).
 * Resolver.begin(version, spans, n, rows) is the native resolve (the checksum in the info
 * structure, nothing compared or kept), and apply(stepper, hook, layer, rows, n, spans, n_spans,
 * bf16) a native site's apply; both return the error code, the GIL released around the call.
 * end(stepper) ends a native step the same way and returns (error code, checksum).
 *
 * Two helpers of the same steps call nothing: pack() writes a step's spans as shmsteer_span
 * records (the header's layout) and compares them with the last step's, for
 * shmsteer._spans.SpanPacker; index_rows() turns a resolve's row index into the device path's
 * int64 row and slot lists.
 *
 * Built by `go generate ./capi` (capi/pyext.sh) against the stable ABI (Python >= 3.10).
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "shmsteer.h"

/* The library's functions, set by bind(); their prototypes checked against shmsteer.h. */
static __typeof__(&shmsteer_batch_resolve) batch_resolve;
static __typeof__(&shmsteer_batch_report) batch_report;
static __typeof__(&shmsteer_stepper_apply) stepper_apply;
static __typeof__(&shmsteer_stepper_apply_bf16) stepper_apply_bf16;
static __typeof__(&shmsteer_stepper_end) stepper_end;

enum { CHANGED = 0, SAME = -1 };

/* The part of an answer that must equal the last one for SAME: all but version and checksum. */
#define TAIL_OFF offsetof(shmsteer_batch_info, index)
#define TAIL_LEN (sizeof(shmsteer_batch_info) - TAIL_OFF)

typedef struct {
  PyObject_HEAD
  shmsteer_batch_t *batch;
  shmsteer_batch_info *info; /* the caller's structure: kept alive by the caller */
  shmsteer_batch_info last;  /* the last success's answer */
  int have_last;
} Resolver;

static int Resolver_init(PyObject *self_, PyObject *args, PyObject *kwds) {
  Resolver *self = (Resolver *)self_;
  unsigned long long batch, info;
  if (kwds != NULL && PyDict_Size(kwds) != 0) {
    PyErr_SetString(PyExc_TypeError, "shmsteer: _faststep.Resolver takes no keyword arguments");
    return -1;
  }
  if (!PyArg_ParseTuple(args, "KK", &batch, &info)) return -1;
  if (batch == 0 || info == 0) {
    PyErr_SetString(PyExc_ValueError, "shmsteer: _faststep.Resolver: a NULL batch or info address");
    return -1;
  }
  self->batch = (shmsteer_batch_t *)(uintptr_t)batch;
  self->info = (shmsteer_batch_info *)(uintptr_t)info;
  self->have_last = 0;
  return 0;
}

static void Resolver_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
  tp_free(self);
  Py_DECREF(tp);
}

/* The answer just written against the last success's; it becomes the last. */
static long outcome(Resolver *self) {
  const shmsteer_batch_info *in = self->info;
  if (self->have_last && memcmp((const char *)in + TAIL_OFF, (const char *)&self->last + TAIL_OFF, TAIL_LEN) == 0)
    return SAME;
  memcpy(&self->last, in, sizeof *in);
  self->have_last = 1;
  return CHANGED;
}

/* 0 when fn is bound and the call has want arguments; else -1 with the exception set. */
static int ready(const void *fn, Py_ssize_t nargs, Py_ssize_t want, const char *usage) {
  if (fn == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "shmsteer: _faststep used before bind()");
    return -1;
  }
  if (nargs != want) {
    PyErr_Format(PyExc_TypeError, "shmsteer: %s", usage);
    return -1;
  }
  return 0;
}

/* The resolve of args (version, spans, n, rows) with flags into the info structure, the GIL
 * released: 0 with *rc set, or -1 with a Python exception. */
static int call_resolve(Resolver *self, PyObject *const *args, unsigned long flags, int *rc) {
  unsigned long long version = PyLong_AsUnsignedLongLong(args[0]);
  unsigned long long spans = PyLong_AsUnsignedLongLong(args[1]);
  unsigned long long n = PyLong_AsUnsignedLongLong(args[2]);
  long long rows = PyLong_AsLongLong(args[3]);
  if (PyErr_Occurred()) return -1;
  Py_BEGIN_ALLOW_THREADS
  *rc = batch_resolve(self->batch, version, (const shmsteer_span *)(uintptr_t)spans, (size_t)n, rows,
                      (uint32_t)flags, self->info);
  Py_END_ALLOW_THREADS
  return 0;
}

static PyObject *Resolver_resolve(PyObject *self_, PyObject *const *args, Py_ssize_t nargs) {
  Resolver *self = (Resolver *)self_;
  if (ready((const void *)batch_resolve, nargs, 5, "Resolver.resolve(version, spans, n, rows, flags)") < 0) return NULL;
  unsigned long flags = PyLong_AsUnsignedLong(args[4]);
  int rc;
  if ((flags == (unsigned long)-1 && PyErr_Occurred()) || call_resolve(self, args, flags, &rc) < 0) return NULL;
  return PyLong_FromLong(rc != 0 ? rc : outcome(self));
}

static PyObject *Resolver_begin(PyObject *self_, PyObject *const *args, Py_ssize_t nargs) {
  if (ready((const void *)batch_resolve, nargs, 4, "Resolver.begin(version, spans, n, rows)") < 0) return NULL;
  int rc;
  if (call_resolve((Resolver *)self_, args, SHMSTEER_BATCH_NATIVE, &rc) < 0) return NULL;
  return PyLong_FromLong(rc);
}

static PyObject *Resolver_report(PyObject *self_, PyObject *const *args, Py_ssize_t nargs) {
  Resolver *self = (Resolver *)self_;
  if (ready((const void *)batch_report, nargs, 2, "Resolver.report(scores, n)") < 0) return NULL;
  unsigned long long scores = PyLong_AsUnsignedLongLong(args[0]);
  unsigned long long n = PyLong_AsUnsignedLongLong(args[1]);
  if (PyErr_Occurred()) return NULL;
  uint64_t sum = 0;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = batch_report(self->batch, (const float *)(uintptr_t)scores, (size_t)n, &sum);
  Py_END_ALLOW_THREADS
  return Py_BuildValue("(iK)", rc, (unsigned long long)sum);
}

static PyMethodDef Resolver_methods[] = {
    {"resolve", (PyCFunction)(void (*)(void))Resolver_resolve, METH_FASTCALL,
     "resolve(version, spans, n, rows, flags): shmsteer_batch_resolve into the info structure; a positive "
     "error code, or CHANGED or SAME against the last success (spans: an address, 0 for none)"},
    {"begin", (PyCFunction)(void (*)(void))Resolver_begin, METH_FASTCALL,
     "begin(version, spans, n, rows): the native resolve (SHMSTEER_BATCH_NATIVE) into the info structure; the "
     "error code (nothing compared or kept)"},
    {"report", (PyCFunction)(void (*)(void))Resolver_report, METH_FASTCALL,
     "report(scores, n): shmsteer_batch_report of n float32 scores at the address scores (0: none); "
     "(error code, gate checksum)"},
    {NULL, NULL, 0, NULL}};

static PyType_Slot Resolver_slots[] = {
    {Py_tp_doc, "Resolver(batch, info): a shmsteer_batch_t's resolve into the shmsteer_batch_info at info "
                "(addresses; the caller keeps both alive)"},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, Resolver_init},
    {Py_tp_dealloc, Resolver_dealloc},
    {Py_tp_methods, Resolver_methods},
    {0, NULL}};

static PyType_Spec Resolver_spec = {"shmsteer._faststep.Resolver", sizeof(Resolver), 0, Py_TPFLAGS_DEFAULT,
                                    Resolver_slots};

/* apply(stepper, hook, layer, rows, n, spans, n_spans, bf16): a native site's apply. */
static PyObject *apply(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
  (void)mod;
  if (ready((const void *)stepper_apply_bf16, nargs, 8, "apply(stepper, hook, layer, rows, n, spans, n_spans, bf16)") < 0)
    return NULL;
  unsigned long long st = PyLong_AsUnsignedLongLong(args[0]);
  unsigned long hook = PyLong_AsUnsignedLong(args[1]);
  long layer = PyLong_AsLong(args[2]);
  unsigned long long rows = PyLong_AsUnsignedLongLong(args[3]);
  unsigned long long n = PyLong_AsUnsignedLongLong(args[4]);
  unsigned long long spans = PyLong_AsUnsignedLongLong(args[5]);
  unsigned long long nspans = PyLong_AsUnsignedLongLong(args[6]);
  int bf16 = PyObject_IsTrue(args[7]);
  if (PyErr_Occurred() || bf16 < 0) return NULL;
  if (hook > UINT32_MAX || layer < INT32_MIN || layer > INT32_MAX) {
    PyErr_SetString(PyExc_OverflowError, "shmsteer: apply: hook or layer out of range");
    return NULL;
  }
  int rc;
  Py_BEGIN_ALLOW_THREADS
  if (bf16)
    rc = stepper_apply_bf16((shmsteer_stepper_t *)(uintptr_t)st, (uint32_t)hook, (int32_t)layer,
                            (uint16_t *)(uintptr_t)rows, (size_t)n, (const shmsteer_span *)(uintptr_t)spans,
                            (size_t)nspans);
  else
    rc = stepper_apply((shmsteer_stepper_t *)(uintptr_t)st, (uint32_t)hook, (int32_t)layer, (float *)(uintptr_t)rows,
                       (size_t)n, (const shmsteer_span *)(uintptr_t)spans, (size_t)nspans);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(rc);
}

/* end(stepper): a native step's end (shmsteer_stepper_end), the GIL released: (error code,
 * checksum). */
static PyObject *end(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
  (void)mod;
  if (ready((const void *)stepper_end, nargs, 1, "end(stepper)") < 0) return NULL;
  unsigned long long st = PyLong_AsUnsignedLongLong(args[0]);
  if (PyErr_Occurred()) return NULL;
  uint64_t sum = 0;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = stepper_end((shmsteer_stepper_t *)(uintptr_t)st, &sum);
  Py_END_ALLOW_THREADS
  return Py_BuildValue("(iK)", rc, (unsigned long long)sum);
}

/* pack(spans, ids, scratch, cap, last, last_n): a step's spans in shmsteer_span layout, for
 * shmsteer._spans.SpanPacker. spans: a list or tuple of 5-tuples (request id: str, start: int,
 * end: int, phase: "prefill" or "decode", first position: int), with 0 <= start, end <= 2^31-1
 * and 0 <= first position <= 2^31-1; ids: the packer's dict of str -> (UTF-8 bytes, their
 * address), which keeps each record's id alive (an id missing is added, as the packer adds it);
 * scratch: the address of cap records (cap >= len(spans)); last, last_n: the packer's last
 * records (last_n -1: none). The records are written to scratch, then compared with last:
 *   PACK_SAME (0): equal to last's, byte for byte (nothing else written);
 *   PACK_ADVANCED (1): equal but for their first positions, which are written into last;
 *   (records, address, rows): new records: a bytearray of len(spans) records copied from
 *     scratch, the address of its bytes, and the highest end;
 *   PACK_FALLBACK (-1): anything else (another span form, a value out of those ranges, more
 *     spans than cap, more than 2^14 ids): nothing compared (ids may hold the ids of the spans
 *     before the one refused); the packer packs in Python, which checks and raises as it
 *     always did.
 * Nothing it reads runs Python code but a lookup in ids (a str key's own comparison). */
enum { PACK_FALLBACK = -1, PACK_SAME = 0, PACK_ADVANCED = 1 };
#define MAX_IDS (1 << 14)
#define POS_OFF offsetof(shmsteer_span, first_position)

static PyObject *s_prefill, *s_decode; /* interned phase names */

/* A Python int in [0, 2^31-1] into *out: 0, or -1 (an exception cleared) for anything else. */
static int small_index(PyObject *o, int64_t *out) {
  if (!PyLong_CheckExact(o)) return -1;
  long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return -1;
  }
  if (v < 0 || v > INT32_MAX) return -1;
  *out = v;
  return 0;
}

/* The phase code of a phase name, 0 for anything else. */
static int32_t phase_code(PyObject *o) {
  if (o == s_decode) return SHMSTEER_PHASE_DECODE;
  if (o == s_prefill) return SHMSTEER_PHASE_PREFILL;
  if (!PyUnicode_CheckExact(o)) return 0;
  if (PyUnicode_CompareWithASCIIString(o, "decode") == 0) return SHMSTEER_PHASE_DECODE;
  if (PyUnicode_CompareWithASCIIString(o, "prefill") == 0) return SHMSTEER_PHASE_PREFILL;
  return 0;
}

/* rid's (bytes, address) entry in ids (borrowed; made when missing): NULL for a fallback (an
 * exception cleared). */
static PyObject *id_entry(PyObject *ids, PyObject *rid) {
  PyObject *e = PyDict_GetItemWithError(ids, rid);
  if (e == NULL) {
    if (PyErr_Occurred() || PyDict_Size(ids) > MAX_IDS) goto fail;
    PyObject *b = PyUnicode_AsUTF8String(rid);
    if (b == NULL) goto fail;
    PyObject *addr = PyLong_FromVoidPtr(PyBytes_AsString(b));
    e = addr == NULL ? NULL : PyTuple_Pack(2, b, addr);
    Py_DECREF(b);
    Py_XDECREF(addr);
    if (e == NULL) goto fail;
    int rc = PyDict_SetItem(ids, rid, e);
    Py_DECREF(e); /* the dict holds it */
    if (rc < 0) goto fail;
  }
  if (!PyTuple_CheckExact(e) || PyTuple_Size(e) != 2 || !PyBytes_CheckExact(PyTuple_GetItem(e, 0))) return NULL;
  return e;
fail:
  PyErr_Clear();
  return NULL;
}

/* One span into *r: 0, or -1 for a fallback. */
static int pack_one(PyObject *ids, PyObject *sp, shmsteer_span *r) {
  if (!PyTuple_CheckExact(sp) || PyTuple_Size(sp) != 5) return -1;
  PyObject *rid = PyTuple_GetItem(sp, 0);
  int64_t start, end, pos;
  int32_t phase = phase_code(PyTuple_GetItem(sp, 3));
  if (!PyUnicode_CheckExact(rid) || phase == 0 || small_index(PyTuple_GetItem(sp, 1), &start) < 0 ||
      small_index(PyTuple_GetItem(sp, 2), &end) < 0 || small_index(PyTuple_GetItem(sp, 4), &pos) < 0)
    return -1;
  PyObject *e = id_entry(ids, rid);
  if (e == NULL) return -1;
  PyObject *b = PyTuple_GetItem(e, 0);
  memset(r, 0, sizeof *r);
  r->id = PyBytes_AsString(b);
  r->id_len = (size_t)PyBytes_Size(b);
  r->start = start;
  r->end = end;
  r->phase = phase;
  r->first_position = (int32_t)pos;
  return 0;
}

/* The records just packed against last's: PACK_SAME, PACK_ADVANCED (positions written into
 * last) or -1 (they differ otherwise). */
static long compare_last(const shmsteer_span *rec, shmsteer_span *last, Py_ssize_t n) {
  int moved = 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    if (memcmp(&rec[i], &last[i], POS_OFF) != 0) return -1;
    moved |= rec[i].first_position != last[i].first_position;
  }
  if (!moved) return PACK_SAME;
  for (Py_ssize_t i = 0; i < n; i++) last[i].first_position = rec[i].first_position;
  return PACK_ADVANCED;
}

static PyObject *pack(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
  (void)mod;
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError, "shmsteer: pack(spans, ids, scratch, cap, last, last_n)");
    return NULL;
  }
  PyObject *spans = args[0], *ids = args[1];
  unsigned long long scratch = PyLong_AsUnsignedLongLong(args[2]);
  long long cap = PyLong_AsLongLong(args[3]);
  unsigned long long last = PyLong_AsUnsignedLongLong(args[4]);
  long long last_n = PyLong_AsLongLong(args[5]);
  if (PyErr_Occurred()) return NULL;
  if (!PyDict_CheckExact(ids) || scratch == 0) {
    PyErr_SetString(PyExc_TypeError, "shmsteer: pack: ids must be a dict and scratch an address");
    return NULL;
  }
  int list = PyList_CheckExact(spans);
  if (!list && !PyTuple_CheckExact(spans)) return PyLong_FromLong(PACK_FALLBACK);
  Py_ssize_t n = list ? PyList_Size(spans) : PyTuple_Size(spans);
  if (n > cap) return PyLong_FromLong(PACK_FALLBACK);
  shmsteer_span *rec = (shmsteer_span *)(uintptr_t)scratch;
  int64_t rows = 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    /* A str key's comparison in ids may run code that changes a list: its size is read again. */
    if (list && PyList_Size(spans) != n) return PyLong_FromLong(PACK_FALLBACK);
    PyObject *sp = list ? PyList_GetItem(spans, i) : PyTuple_GetItem(spans, i);
    Py_INCREF(sp);
    int rc = pack_one(ids, sp, &rec[i]);
    Py_DECREF(sp);
    if (rc < 0) return PyLong_FromLong(PACK_FALLBACK);
    if (rec[i].end > rows) rows = rec[i].end;
  }
  if (last_n == (long long)n && (n == 0 || last != 0)) {
    long same = compare_last(rec, (shmsteer_span *)(uintptr_t)last, n);
    if (same >= 0) return PyLong_FromLong(same);
  }
  PyObject *recs = PyByteArray_FromStringAndSize((const char *)rec, n * (Py_ssize_t)sizeof *rec);
  if (recs == NULL) return NULL;
  return Py_BuildValue("(NKL)", recs, (unsigned long long)(uintptr_t)PyByteArray_AsString(recs), (long long)rows);
}

/* index_rows(index, n, out, cap): the steered rows of a resolve's index (n int32 slots at the
 * address index, 0: unsteered) as int64 at out (room for 2 * cap, n <= cap): out[0:k] the rows,
 * then out[k:2k] their slots, one contiguous [2, k] block (a single upload); returns k. */
static PyObject *index_rows(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
  (void)mod;
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "shmsteer: index_rows(index, n, out, cap)");
    return NULL;
  }
  unsigned long long index = PyLong_AsUnsignedLongLong(args[0]);
  unsigned long long n = PyLong_AsUnsignedLongLong(args[1]);
  unsigned long long out = PyLong_AsUnsignedLongLong(args[2]);
  unsigned long long cap = PyLong_AsUnsignedLongLong(args[3]);
  if (PyErr_Occurred()) return NULL;
  if (n > cap || (n > 0 && (index == 0 || out == 0))) {
    PyErr_SetString(PyExc_ValueError, "shmsteer: index_rows: n past cap, or a NULL address");
    return NULL;
  }
  const int32_t *idx = (const int32_t *)(uintptr_t)index;
  int64_t *o = (int64_t *)(uintptr_t)out;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (idx[i] != 0) {
      o[k] = (int64_t)i;
      o[cap + k] = idx[i];
      k++;
    }
  }
  memmove(o + k, o + cap, k * sizeof *o);
  return PyLong_FromSize_t(k);
}

static PyObject *bind(PyObject *mod, PyObject *args) {
  (void)mod;
  unsigned long long resolve, report, ap, ap16, en;
  if (!PyArg_ParseTuple(args, "KKKKK", &resolve, &report, &ap, &ap16, &en)) return NULL;
  if (resolve == 0 || report == 0 || ap == 0 || ap16 == 0 || en == 0) {
    PyErr_SetString(PyExc_ValueError, "shmsteer: _faststep.bind: a NULL function address");
    return NULL;
  }
  batch_resolve = (__typeof__(batch_resolve))(uintptr_t)resolve;
  batch_report = (__typeof__(batch_report))(uintptr_t)report;
  stepper_apply = (__typeof__(stepper_apply))(uintptr_t)ap;
  stepper_apply_bf16 = (__typeof__(stepper_apply_bf16))(uintptr_t)ap16;
  stepper_end = (__typeof__(stepper_end))(uintptr_t)en;
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind(batch_resolve, batch_report, stepper_apply, stepper_apply_bf16, stepper_end): the addresses of the "
     "loaded library's functions, before any call"},
    {"apply", (PyCFunction)(void (*)(void))apply, METH_FASTCALL,
     "apply(stepper, hook, layer, rows, n, spans, n_spans, bf16): shmsteer_stepper_apply (or _bf16) on n "
     "elements at the address rows; the error code"},
    {"end", (PyCFunction)(void (*)(void))end, METH_FASTCALL,
     "end(stepper): shmsteer_stepper_end of a native step; (error code, checksum)"},
    {"pack", (PyCFunction)(void (*)(void))pack, METH_FASTCALL,
     "pack(spans, ids, scratch, cap, last, last_n): a step's 5-tuple spans as shmsteer_span records (see "
     "_faststep.c); PACK_SAME, PACK_ADVANCED, PACK_FALLBACK or (records, address, rows)"},
    {"index_rows", (PyCFunction)(void (*)(void))index_rows, METH_FASTCALL,
     "index_rows(index, n, out, cap): the steered rows of n int32 slots at index as int64 rows at out[:k] "
     "and their slots at out[k:2k] (out: room for 2 * cap); k"},
    {NULL, NULL, 0, NULL}};

static int exec_module(PyObject *m) {
  PyObject *tp = PyType_FromSpec(&Resolver_spec);
  if (tp == NULL) return -1;
  if (PyModule_AddObject(m, "Resolver", tp) < 0) {
    Py_DECREF(tp);
    return -1;
  }
  if (PyModule_AddIntConstant(m, "CHANGED", CHANGED) < 0 || PyModule_AddIntConstant(m, "SAME", SAME) < 0 ||
      PyModule_AddIntConstant(m, "INFO_BYTES", (long)sizeof(shmsteer_batch_info)) < 0 ||
      PyModule_AddIntConstant(m, "SPAN_BYTES", (long)sizeof(shmsteer_span)) < 0 ||
      PyModule_AddIntConstant(m, "PACK_FALLBACK", PACK_FALLBACK) < 0 ||
      PyModule_AddIntConstant(m, "PACK_SAME", PACK_SAME) < 0 ||
      PyModule_AddIntConstant(m, "PACK_ADVANCED", PACK_ADVANCED) < 0)
    return -1;
  if (s_prefill == NULL && (s_prefill = PyUnicode_InternFromString("prefill")) == NULL) return -1;
  if (s_decode == NULL && (s_decode = PyUnicode_InternFromString("decode")) == NULL) return -1;
  return 0;
}

static PyModuleDef_Slot module_slots[] = {{Py_mod_exec, exec_module}, {0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "shmsteer._faststep",
    "A device worker's per-step resolve without ctypes (see _faststep.c).",
    0,
    methods,
    module_slots,
    NULL,
    NULL,
    NULL};

PyMODINIT_FUNC PyInit__faststep(void) { return PyModuleDef_Init(&module); }
