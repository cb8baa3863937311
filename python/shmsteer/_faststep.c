/* _faststep: a worker's engine calls per step as CPython methods: on the device path the
 * resolve (shmsteer_batch_resolve) and the report of a step with probe gates
 * (shmsteer_batch_report), with the comparison of the resolve's answer with the last one; on
 * the native path the resolve that begins the step (SHMSTEER_BATCH_NATIVE) and each site's apply
 * (shmsteer_stepper_apply, shmsteer_stepper_apply_bf16). A steady decode step then runs no
 * ctypes call and builds no Python object of the answer.
 *
 * It calls the exported C ABI only (shmsteer.h: those four functions),
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

static PyObject *bind(PyObject *mod, PyObject *args) {
  (void)mod;
  unsigned long long resolve, report, ap, ap16;
  if (!PyArg_ParseTuple(args, "KKKK", &resolve, &report, &ap, &ap16)) return NULL;
  if (resolve == 0 || report == 0 || ap == 0 || ap16 == 0) {
    PyErr_SetString(PyExc_ValueError, "shmsteer: _faststep.bind: a NULL function address");
    return NULL;
  }
  batch_resolve = (__typeof__(batch_resolve))(uintptr_t)resolve;
  batch_report = (__typeof__(batch_report))(uintptr_t)report;
  stepper_apply = (__typeof__(stepper_apply))(uintptr_t)ap;
  stepper_apply_bf16 = (__typeof__(stepper_apply_bf16))(uintptr_t)ap16;
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind(batch_resolve, batch_report, stepper_apply, stepper_apply_bf16): the addresses of the loaded "
     "library's functions, before any call"},
    {"apply", (PyCFunction)(void (*)(void))apply, METH_FASTCALL,
     "apply(stepper, hook, layer, rows, n, spans, n_spans, bf16): shmsteer_stepper_apply (or _bf16) on n "
     "elements at the address rows; the error code"},
    {NULL, NULL, 0, NULL}};

static int exec_module(PyObject *m) {
  PyObject *tp = PyType_FromSpec(&Resolver_spec);
  if (tp == NULL) return -1;
  if (PyModule_AddObject(m, "Resolver", tp) < 0) {
    Py_DECREF(tp);
    return -1;
  }
  if (PyModule_AddIntConstant(m, "CHANGED", CHANGED) < 0 || PyModule_AddIntConstant(m, "SAME", SAME) < 0 ||
      PyModule_AddIntConstant(m, "INFO_BYTES", (long)sizeof(shmsteer_batch_info)) < 0)
    return -1;
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
