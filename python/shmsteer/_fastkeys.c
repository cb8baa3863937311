/* _fastkeys: the key get of shmsteer.Keys as a CPython type slot, so ``keys[id]`` runs no Python
 * code and makes no ctypes call on its hot path.
 *
 * It calls the exported C ABI only (shmsteer.h: shmsteer_reader_key_get, shmsteer_key_get),
 * through function pointers that shmsteer._lib hands to bind() from the library it loaded with
 * ctypes (so both use one copy of libshmsteer.so, the one whose ABI version _lib checked). It
 * knows nothing of the region's layout: the library answers every get.
 *
 * KeysBase is the C base of shmsteer.keys._FastKeys, whose Python part (shmsteer.keys.Keys)
 * keeps everything else: the per-thread readers (opened, counted and closed there), the error
 * mapping and every other method. A get here:
 *   1. takes the id's bytes (an exact str as UTF-8, or exact bytes; any other type goes to the
 *      Python get, keys._get_ctypes, so both paths give the same answers and exceptions);
 *   2. finds this thread's reader for this Keys in a small per-thread cache keyed by the Keys'
 *      serial (never reused in the process); on a miss it asks Keys._thread_handle(), which
 *      opens the thread's reader as the ctypes path does;
 *   3. calls shmsteer_reader_key_get (or shmsteer_key_get on the handle's shared slots, past
 *      THREAD_READERS threads) with the GIL held, as ctypes.PyDLL does: the call never blocks;
 *   4. on success returns the key as bytes; on any failure (revoked, not found, a key longer
 *      than the stack buffer, a closed handle, a forked child, ...) calls Keys._get_slow(rc, id),
 *      the ctypes path's own error handling, right after the failing call (so the thread's last
 *      error message is that call's).
 *
 * Built by `go generate ./capi` (capi/pyext.sh) against the stable ABI (Python >= 3.10).
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "shmsteer.h"

/* The library's functions, set by bind(); prototypes checked against shmsteer.h. */
static __typeof__(&shmsteer_reader_key_get) reader_get;
static __typeof__(&shmsteer_key_get) handle_get;

/* The key buffer on the stack: as large as the library's per-thread one, so the same keys take
 * the fast path on either path. */
#define FAST_KEY_BYTES SHMSTEER_KEY_BUFFER_BYTES

typedef struct {
  PyObject_HEAD
  uint64_t serial; /* this object's cache key; 0 never */
} KeysBase;

/* A thread's readers of its last few Keys objects. The reader handle is the Python side's (held
 * by the Keys' threading.local, closed when the thread ends or the Keys goes): a serial is never
 * reused, so an entry of a Keys that is gone is never matched again. */
#define CACHE_WAYS 4
typedef struct {
  uint64_t serial;
  void *h;       /* shmsteer_reader_t* or shmsteer_t* */
  int is_reader; /* h is a reader (else the handle's shared slots) */
} cache_entry;

static _Thread_local cache_entry cache[CACHE_WAYS];
static _Thread_local unsigned cache_next;
static uint64_t next_serial; /* under the GIL */

static PyObject *str_thread_handle, *str_get_slow, *str_get_ctypes;

static PyObject *KeysBase_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
  (void)args;
  (void)kwds;
  allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
  KeysBase *self = (KeysBase *)alloc(type, 0);
  if (self != NULL) self->serial = ++next_serial;
  return (PyObject *)self;
}

static void KeysBase_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
  tp_free(self);
  Py_DECREF(tp);
}

/* This thread's entry for self, asking the Python side on a miss; NULL with an exception set. */
static cache_entry *thread_entry(KeysBase *self) {
  for (int i = 0; i < CACHE_WAYS; i++)
    if (cache[i].serial == self->serial) return &cache[i];
  PyObject *r = PyObject_CallMethodObjArgs((PyObject *)self, str_thread_handle, NULL);
  if (r == NULL) return NULL;
  unsigned long long hv = 0;
  int is_reader = 0;
  if (!PyArg_ParseTuple(r, "Kp", &hv, &is_reader)) {
    Py_DECREF(r);
    return NULL;
  }
  Py_DECREF(r);
  cache_entry *e = &cache[cache_next++ % CACHE_WAYS];
  e->serial = self->serial;
  e->h = (void *)(uintptr_t)hv;
  e->is_reader = is_reader;
  return e;
}

static PyObject *KeysBase_subscript(PyObject *op, PyObject *key) {
  KeysBase *self = (KeysBase *)op;
  const char *id;
  Py_ssize_t n;
  if (Py_IS_TYPE(key, &PyUnicode_Type)) {
    id = PyUnicode_AsUTF8AndSize(key, &n);
    if (id == NULL) return NULL;
  } else if (Py_IS_TYPE(key, &PyBytes_Type)) {
    char *p;
    if (PyBytes_AsStringAndSize(key, &p, &n) < 0) return NULL;
    id = p;
  } else {
    return PyObject_CallMethodObjArgs(op, str_get_ctypes, key, NULL);
  }
  if (reader_get == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "shmsteer: _fastkeys used before bind()");
    return NULL;
  }
  cache_entry *e = thread_entry(self);
  if (e == NULL) return NULL;
  char buf[FAST_KEY_BYTES];
  size_t len = 0;
  int rc = e->is_reader ? reader_get((shmsteer_reader_t *)e->h, id, (size_t)n, buf, sizeof buf, &len)
                        : handle_get((shmsteer_t *)e->h, id, (size_t)n, buf, sizeof buf, &len);
  if (rc == SHMSTEER_OK) return PyBytes_FromStringAndSize(buf, (Py_ssize_t)len);
  PyObject *code = PyLong_FromLong(rc);
  PyObject *rid = code ? PyBytes_FromStringAndSize(id, n) : NULL;
  PyObject *out = rid ? PyObject_CallMethodObjArgs(op, str_get_slow, code, rid, NULL) : NULL;
  Py_XDECREF(code);
  Py_XDECREF(rid);
  return out;
}

static PyType_Slot KeysBase_slots[] = {
    {Py_tp_doc, "C base of shmsteer.keys._FastKeys: its ``keys[id]`` (see the module's doc)."},
    {Py_tp_new, KeysBase_new},
    {Py_tp_dealloc, KeysBase_dealloc},
    {Py_mp_subscript, KeysBase_subscript},
    {0, NULL},
};

static PyType_Spec KeysBase_spec = {
    .name = "shmsteer._fastkeys.KeysBase",
    .basicsize = sizeof(KeysBase),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = KeysBase_slots,
};

static PyObject *bind(PyObject *mod, PyObject *args) {
  (void)mod;
  unsigned long long rg, hg;
  if (!PyArg_ParseTuple(args, "KK", &rg, &hg)) return NULL;
  if (rg == 0 || hg == 0) {
    PyErr_SetString(PyExc_ValueError, "shmsteer: _fastkeys.bind: a NULL function address");
    return NULL;
  }
  reader_get = (__typeof__(reader_get))(uintptr_t)rg;
  handle_get = (__typeof__(handle_get))(uintptr_t)hg;
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind(reader_key_get, key_get): the addresses of the loaded library's shmsteer_reader_key_get "
     "and shmsteer_key_get (shmsteer._lib passes them; call it once, before any get)."},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *m) {
  if (!(str_thread_handle = PyUnicode_InternFromString("_thread_handle"))) return -1;
  if (!(str_get_slow = PyUnicode_InternFromString("_get_slow"))) return -1;
  if (!(str_get_ctypes = PyUnicode_InternFromString("_get_ctypes"))) return -1;
  PyObject *t = PyType_FromSpec(&KeysBase_spec);
  if (t == NULL) return -1;
  if (PyModule_AddObject(m, "KeysBase", t) < 0) {
    Py_DECREF(t);
    return -1;
  }
  if (PyModule_AddIntConstant(m, "KEY_BUFFER_BYTES", FAST_KEY_BYTES) < 0) return -1;
  return 0;
}

static PyModuleDef_Slot module_slots[] = {{Py_mod_exec, exec_module}, {0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "shmsteer._fastkeys",
    .m_doc = "Key gets of shmsteer.Keys through the C ABI without ctypes (see shmsteer.keys).",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = module_slots,
};

PyMODINIT_FUNC PyInit__fastkeys(void) { return PyModuleDef_Init(&module); }
