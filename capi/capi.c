//go:build cgo

// The exported ABI of libshmsteer.so: thin wrappers that refuse, in C, every call made in a
// child forked after the library was loaded (the Go runtime does not survive fork), then call
// the Go implementation (exports.go). See shmsteer.h for the contract.

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shmsteer.h"
#include "plan.h"
#include "_cgo_export.h"

#define SHMSTEER_API __attribute__((visibility("default")))

static atomic_int shmsteer_forked;

// Per-thread buffers live on the heap, found through a __thread pointer: the Go runtime makes
// this library use the static TLS model, where a dlopen'ed library has only a few hundred bytes
// to spare. A pthread key frees them when the thread exits.
typedef struct {
  char errmsg[SHMSTEER_ERRMSG_MAX];
  unsigned char keybuf[SHMSTEER_KEY_BUFFER_BYTES];
} shmsteer_tls;

static __thread shmsteer_tls *shmsteer_tls_p;
static pthread_key_t shmsteer_tls_key;
static char shmsteer_no_memory[] = "shmsteer: out of memory for the thread's buffers";

static shmsteer_tls *shmsteer_tls_get(void) {
  shmsteer_tls *t = shmsteer_tls_p;
  if (__builtin_expect(t == NULL, 0)) {
    t = calloc(1, sizeof *t);
    if (t == NULL) return NULL;
    pthread_setspecific(shmsteer_tls_key, t);
    shmsteer_tls_p = t;
  }
  return t;
}

// The thread's message buffer; NULL only when out of memory.
static char *shmsteer_errmsg_buf(void) {
  shmsteer_tls *t = shmsteer_tls_get();
  return t ? t->errmsg : NULL;
}

static void shmsteer_on_fork_child(void) { atomic_store_explicit(&shmsteer_forked, 1, memory_order_relaxed); }

__attribute__((constructor)) static void shmsteer_init(void) {
  pthread_key_create(&shmsteer_tls_key, free);
  pthread_atfork(NULL, NULL, shmsteer_on_fork_child);
}

// The thread-local message buffer, for the Go side (a static scratch buffer when out of memory).
char *capi_errbuf(void) {
  static char scratch[SHMSTEER_ERRMSG_MAX];
  char *b = shmsteer_errmsg_buf();
  return b ? b : scratch;
}

static int shmsteer_forked_error(void) {
  static const char msg[] =
      "shmsteer: called in a process forked after libshmsteer was loaded; the Go runtime does not "
      "survive fork: start workers with the spawn start method (fork+exec) and load the library there";
  char *b = shmsteer_errmsg_buf();
  if (b) memcpy(b, msg, sizeof msg);
  return SHMSTEER_E_FORKED;
}

#define ENTER()                                                                      \
  do {                                                                               \
    if (__builtin_expect(atomic_load_explicit(&shmsteer_forked, memory_order_relaxed), 0)) \
      return shmsteer_forked_error();                                                \
    if (shmsteer_tls_p) shmsteer_tls_p->errmsg[0] = 0;                               \
  } while (0)

#define H(p) ((uint64_t)(uintptr_t)(p))

// out handles: Go writes a uint64 handle, C hands out an opaque pointer of the same value.
#define OUT_HANDLE(type, call, out)  \
  do {                               \
    uint64_t hv = 0;                 \
    int rc = (call);                 \
    if (rc == SHMSTEER_OK && (out)) *(out) = (type *)(uintptr_t)hv; \
    return rc;                       \
  } while (0)

SHMSTEER_API int shmsteer_abi_version(void) { return SHMSTEER_ABI_VERSION; }

SHMSTEER_API const char *shmsteer_last_error(void) {
  char *b = shmsteer_errmsg_buf();
  return b ? b : shmsteer_no_memory;
}

// shmsteer_error_name is in errnames_gen.c, generated from errors.tab.

// The environment as the process sees it now: Go's os.Getenv reads a copy taken when the
// runtime started, which misses a later setenv (Python's os.environ, say).
// Neither argument given: SHMSTEER_SECRET as the bytes, SHMSTEER_SECRET_FILE as the file (both
// set reaches Go as both given: SHMSTEER_E_SECRET_CONFLICT, as in a Go process).
static void shmsteer_env_secret(const void **secret, size_t *secret_len, const char **secret_file) {
  if (*secret == NULL && *secret_file == NULL) {
    const char *v = getenv("SHMSTEER_SECRET");
    const char *f = getenv("SHMSTEER_SECRET_FILE");
    if (v != NULL && v[0] != 0) {
      *secret = v;
      *secret_len = strlen(v);
    }
    if (f != NULL && f[0] != 0) *secret_file = f;
  }
}

SHMSTEER_API int shmsteer_attach(const char *ns, const void *secret, size_t secret_len,
                                 const char *secret_file, int64_t timeout_ms, shmsteer_t **out) {
  ENTER();
  shmsteer_env_secret(&secret, &secret_len, &secret_file);
  OUT_HANDLE(shmsteer_t,
             shmsteerGo_attach((char *)ns, (void *)secret, secret_len, (char *)secret_file, timeout_ms, &hv),
             out);
}

SHMSTEER_API int shmsteer_owner_start(const char *ns, const void *secret, size_t secret_len,
                                      const char *secret_file, const shmsteer_owner_config *cfg,
                                      shmsteer_t **out) {
  ENTER();
  shmsteer_env_secret(&secret, &secret_len, &secret_file);
  OUT_HANDLE(shmsteer_t,
             shmsteerGo_owner_start((char *)ns, (void *)secret, secret_len, (char *)secret_file,
                                    (shmsteer_owner_config *)cfg, &hv),
             out);
}

SHMSTEER_API int shmsteer_close(shmsteer_t *h) { ENTER(); return shmsteerGo_close(H(h)); }
SHMSTEER_API int shmsteer_ping(shmsteer_t *h) { ENTER(); return shmsteerGo_ping(H(h)); }

SHMSTEER_API int shmsteer_model(shmsteer_t *h, int32_t *hidden, int32_t *layers, int32_t *num_hooks) {
  ENTER();
  return shmsteerGo_model(H(h), hidden, layers, num_hooks);
}

SHMSTEER_API int shmsteer_hook_id(shmsteer_t *h, const char *name, uint32_t *id) {
  ENTER();
  return shmsteerGo_hook_id(H(h), (char *)name, id);
}

SHMSTEER_API int shmsteer_version(shmsteer_t *h, uint64_t *version) {
  ENTER();
  return shmsteerGo_version(H(h), version);
}

SHMSTEER_API int shmsteer_status_json(shmsteer_t *h, char *buf, size_t cap, size_t *len) {
  ENTER();
  return shmsteerGo_status_json(H(h), buf, cap, len);
}

SHMSTEER_API int shmsteer_key_get(shmsteer_t *h, const char *id, size_t id_len, void *buf, size_t cap,
                                  size_t *len) {
  ENTER();
  return shmsteerGo_key_get(H(h), (char *)id, id_len, buf, cap, len);
}

SHMSTEER_API void *shmsteer_key_buffer(void) {
  shmsteer_tls *t = shmsteer_tls_get();
  return t ? t->keybuf : NULL;
}

int capi_fast_get(uint64_t h, const char *id, size_t id_len, void *buf, size_t cap, size_t *len);

// The _tls gets: the key into the thread's buffer; through a reader (reader = 1), the C reader
// first.
static int64_t shmsteer_get_tls(uint64_t h, const char *id, int reader) {
  if (__builtin_expect(atomic_load_explicit(&shmsteer_forked, memory_order_relaxed), 0))
    return -(int64_t)shmsteer_forked_error();
  shmsteer_tls *t = shmsteer_tls_get();
  if (t == NULL) return -(int64_t)SHMSTEER_E_OTHER;
  t->errmsg[0] = 0;
  int (*get)(uint64_t, char *, size_t, void *, size_t, size_t *) = reader ? shmsteerGo_reader_key_get : shmsteerGo_key_get;
  if (id == NULL) return -(int64_t)get(h, NULL, 1, NULL, 0, NULL);
  size_t n = 0, idl = strlen(id);
  if (reader && capi_fast_get(h, id, idl, t->keybuf, sizeof t->keybuf, &n)) return (int64_t)n;
  int rc = get(h, (char *)id, idl, t->keybuf, sizeof t->keybuf, &n);
  return rc ? -(int64_t)rc : (int64_t)n;
}

SHMSTEER_API int64_t shmsteer_key_get_tls(shmsteer_t *h, const char *id) { return shmsteer_get_tls(H(h), id, 0); }

SHMSTEER_API int shmsteer_key_set(shmsteer_t *h, const char *id, size_t id_len, const void *key,
                                  size_t key_len) {
  ENTER();
  return shmsteerGo_key_set(H(h), (char *)id, id_len, (void *)key, key_len);
}

SHMSTEER_API int shmsteer_key_remove(shmsteer_t *h, const char *id, size_t id_len) {
  ENTER();
  return shmsteerGo_key_remove(H(h), (char *)id, id_len);
}

SHMSTEER_API int shmsteer_key_list_json(shmsteer_t *h, char *buf, size_t cap, size_t *len) {
  ENTER();
  return shmsteerGo_key_list_json(H(h), buf, cap, len);
}

SHMSTEER_API int shmsteer_reader_open(shmsteer_t *h, shmsteer_reader_t **out) {
  ENTER();
  OUT_HANDLE(shmsteer_reader_t, shmsteerGo_reader_open(H(h), &hv), out);
}

// The C reader (keys_fast.c) answers the common case without entering Go; the rest goes to Go.
SHMSTEER_API int shmsteer_reader_key_get(shmsteer_reader_t *r, const char *id, size_t id_len, void *buf,
                                         size_t cap, size_t *len) {
  ENTER();
  if ((buf != NULL || cap == 0) && cap <= INT32_MAX && capi_fast_get(H(r), id, id_len, buf, cap, len))
    return SHMSTEER_OK;
  return shmsteerGo_reader_key_get(H(r), (char *)id, id_len, buf, cap, len);
}

SHMSTEER_API int64_t shmsteer_reader_key_get_tls(shmsteer_reader_t *r, const char *id) {
  return shmsteer_get_tls(H(r), id, 1);
}

SHMSTEER_API int shmsteer_reader_close(shmsteer_reader_t *r) { ENTER(); return shmsteerGo_reader_close(H(r)); }

int capi_fast_known(uint64_t h);

// A registered reader's items go to the C reader one by one, and only those it does not answer
// to the engine, each as shmsteer_reader_key_get would send it; anything else (a bad handle,
// items NULL) is the engine's whole call, as before.
SHMSTEER_API int shmsteer_reader_key_get_many(shmsteer_reader_t *r, shmsteer_key_get_item *items, size_t n) {
  ENTER();
  if (items == NULL || n > INT32_MAX || !capi_fast_known(H(r)))
    return shmsteerGo_reader_key_get_many(H(r), items, n);
  for (size_t i = 0; i < n; i++) {
    shmsteer_key_get_item *it = &items[i];
    if ((it->buf != NULL || it->cap == 0) && it->cap <= INT32_MAX &&
        capi_fast_get(H(r), it->id, it->id_len, it->buf, it->cap, &it->len)) {
      it->rc = SHMSTEER_OK;
      continue;
    }
    it->rc = shmsteerGo_reader_key_get(H(r), (char *)it->id, it->id_len, it->buf, it->cap, &it->len);
  }
  return SHMSTEER_OK;
}

SHMSTEER_API int shmsteer_snapshot_open(shmsteer_t *h, uint64_t version, shmsteer_snapshot_t **out,
                                        uint64_t *pinned) {
  ENTER();
  OUT_HANDLE(shmsteer_snapshot_t, shmsteerGo_snapshot_open(H(h), version, &hv, pinned), out);
}

SHMSTEER_API int shmsteer_snapshot_close(shmsteer_snapshot_t *s) { ENTER(); return shmsteerGo_snapshot_close(H(s)); }

SHMSTEER_API int shmsteer_vector_view(shmsteer_snapshot_t *s, const char *name, size_t name_len,
                                      shmsteer_vector_info *info, shmsteer_vector_entry *entries, size_t cap) {
  ENTER();
  return shmsteerGo_vector_view(H(s), (char *)name, name_len, info, entries, cap);
}

SHMSTEER_API int shmsteer_vector_list_json(shmsteer_snapshot_t *s, char *buf, size_t cap, size_t *len) {
  ENTER();
  return shmsteerGo_vector_list_json(H(s), buf, cap, len);
}

SHMSTEER_API int shmsteer_vector_model_hint(shmsteer_snapshot_t *s, const char *name, size_t name_len, char *buf,
                                            size_t cap, size_t *len) {
  ENTER();
  return shmsteerGo_vector_model_hint(H(s), (char *)name, name_len, buf, cap, len);
}

SHMSTEER_API int shmsteer_vector_register(shmsteer_t *h, const char *name, size_t name_len,
                                          const shmsteer_vector_entry *entries, size_t n, uint64_t *version) {
  ENTER();
  return shmsteerGo_vector_register(H(h), (char *)name, name_len, (shmsteer_vector_entry *)entries, n, version);
}

SHMSTEER_API int shmsteer_vector_unregister(shmsteer_t *h, const char *name, size_t name_len, uint64_t *version) {
  ENTER();
  return shmsteerGo_vector_unregister(H(h), (char *)name, name_len, version);
}

SHMSTEER_API int shmsteer_probe_view(shmsteer_snapshot_t *s, const char *name, size_t name_len,
                                     shmsteer_vector_info *info, shmsteer_vector_entry *entries, size_t cap) {
  ENTER();
  return shmsteerGo_probe_view(H(s), (char *)name, name_len, info, entries, cap);
}

SHMSTEER_API int shmsteer_probe_list_json(shmsteer_snapshot_t *s, char *buf, size_t cap, size_t *len) {
  ENTER();
  return shmsteerGo_probe_list_json(H(s), buf, cap, len);
}

SHMSTEER_API int shmsteer_probe_register(shmsteer_t *h, const char *name, size_t name_len,
                                         const shmsteer_vector_entry *entries, size_t n, uint64_t *version) {
  ENTER();
  return shmsteerGo_probe_register(H(h), (char *)name, name_len, (shmsteer_vector_entry *)entries, n, version);
}

SHMSTEER_API int shmsteer_probe_unregister(shmsteer_t *h, const char *name, size_t name_len, uint64_t *version) {
  ENTER();
  return shmsteerGo_probe_unregister(H(h), (char *)name, name_len, version);
}

SHMSTEER_API int shmsteer_global_set_json(shmsteer_t *h, const char *json, size_t json_len, uint64_t *version) {
  ENTER();
  return shmsteerGo_global_set_json(H(h), (char *)json, json_len, version);
}

SHMSTEER_API int shmsteer_gates_check(const char *json, size_t json_len, size_t *n_gates) {
  ENTER();
  return shmsteerGo_gates_check((char *)json, json_len, n_gates);
}

SHMSTEER_API int shmsteer_gates_check_at(shmsteer_snapshot_t *s, const char *id, size_t id_len, const char *json,
                                         size_t json_len, size_t *n_gates) {
  ENTER();
  return shmsteerGo_gates_check_at(H(s), (char *)id, id_len, (char *)json, json_len, n_gates);
}

SHMSTEER_API int shmsteer_request_admit_json(shmsteer_t *h, const char *id, size_t id_len, const char *json,
                                             size_t json_len, uint64_t *version) {
  ENTER();
  return shmsteerGo_request_admit_json(H(h), (char *)id, id_len, (char *)json, json_len, version);
}

SHMSTEER_API int shmsteer_request_admit_result(shmsteer_t *h, const char *id, size_t id_len, const char *json,
                                               size_t json_len, shmsteer_admitted *out) {
  ENTER();
  return shmsteerGo_request_admit_result(H(h), (char *)id, id_len, (char *)json, json_len, out);
}

SHMSTEER_API int shmsteer_request_admit_binary(shmsteer_t *h, const char *id, size_t id_len, const char *json,
                                               size_t json_len, const shmsteer_admit_vector *vectors,
                                               size_t n_vectors, shmsteer_admitted *out) {
  ENTER();
  return shmsteerGo_request_admit_binary(H(h), (char *)id, id_len, (char *)json, json_len,
                                         (shmsteer_admit_vector *)vectors, n_vectors, out);
}

SHMSTEER_API int shmsteer_request_admit_buffers(shmsteer_t *h, const char *id, size_t id_len, const char *json,
                                                size_t json_len, const shmsteer_admit_vector *vectors,
                                                size_t n_vectors, const shmsteer_admit_clamp *clamps,
                                                size_t n_clamps, shmsteer_admitted *out) {
  ENTER();
  return shmsteerGo_request_admit_buffers(H(h), (char *)id, id_len, (char *)json, json_len,
                                          (shmsteer_admit_vector *)vectors, n_vectors,
                                          (shmsteer_admit_clamp *)clamps, n_clamps, out);
}

SHMSTEER_API int shmsteer_request_end(shmsteer_t *h, const char *id, size_t id_len, uint64_t *version) {
  ENTER();
  return shmsteerGo_request_end(H(h), (char *)id, id_len, version);
}

SHMSTEER_API int shmsteer_stepper_new(shmsteer_t *h, shmsteer_stepper_t **out) {
  ENTER();
  OUT_HANDLE(shmsteer_stepper_t, shmsteerGo_stepper_new(H(h), &hv), out);
}

SHMSTEER_API int shmsteer_stepper_free(shmsteer_stepper_t *st) { ENTER(); return shmsteerGo_stepper_free(H(st)); }

SHMSTEER_API int shmsteer_stepper_set_strict(shmsteer_stepper_t *st, int32_t strict) {
  ENTER();
  return shmsteerGo_stepper_set_strict(H(st), strict);
}

SHMSTEER_API int shmsteer_stepper_begin(shmsteer_stepper_t *st, uint64_t version, uint64_t *pinned) {
  ENTER();
  return shmsteerGo_stepper_begin(H(st), version, pinned);
}

SHMSTEER_API int shmsteer_stepper_apply(shmsteer_stepper_t *st, uint32_t hook, int32_t layer, float *rows,
                                        size_t n_floats, const shmsteer_span *spans, size_t n_spans) {
  ENTER();
  if (capi_plan_apply(H(st), hook, layer, rows, n_floats, 0, spans, n_spans)) return SHMSTEER_OK; // plan.c
  return shmsteerGo_stepper_apply(H(st), hook, layer, rows, n_floats, (shmsteer_span *)spans, n_spans);
}

SHMSTEER_API int shmsteer_stepper_apply_bf16(shmsteer_stepper_t *st, uint32_t hook, int32_t layer, uint16_t *rows,
                                             size_t n_values, const shmsteer_span *spans, size_t n_spans) {
  ENTER();
  if (capi_plan_apply(H(st), hook, layer, rows, n_values, 1, spans, n_spans)) return SHMSTEER_OK; // plan.c
  return shmsteerGo_stepper_apply_bf16(H(st), hook, layer, rows, n_values, (shmsteer_span *)spans, n_spans);
}

SHMSTEER_API int shmsteer_stepper_bind(shmsteer_stepper_t *st, const shmsteer_span *spans, size_t n_spans,
                                       size_t n_rows) {
  ENTER();
  return shmsteerGo_stepper_bind(H(st), (shmsteer_span *)spans, n_spans, n_rows);
}

SHMSTEER_API int shmsteer_stepper_apply_bound(shmsteer_stepper_t *st, uint32_t hook, int32_t layer, float *rows,
                                              size_t n_floats) {
  ENTER();
  return shmsteerGo_stepper_apply_bound(H(st), hook, layer, rows, n_floats);
}

SHMSTEER_API int shmsteer_stepper_effective(shmsteer_stepper_t *st, const char *id, size_t id_len,
                                            uint32_t hook, int32_t layer, int32_t phase,
                                            shmsteer_effective *out) {
  ENTER();
  return shmsteerGo_stepper_effective(H(st), (char *)id, id_len, hook, layer, phase, out);
}

SHMSTEER_API int shmsteer_stepper_end(shmsteer_stepper_t *st, uint64_t *checksum) {
  ENTER();
  if (capi_plan_end(H(st), checksum)) return SHMSTEER_OK; // plan.c
  return shmsteerGo_stepper_end(H(st), checksum);
}

SHMSTEER_API int shmsteer_stepper_stats(shmsteer_stepper_t *st, shmsteer_step_stats *out) {
  ENTER();
  return shmsteerGo_stepper_stats(H(st), out);
}

SHMSTEER_API int shmsteer_stepper_report_gates(shmsteer_stepper_t *st, const char *worker, size_t worker_len) {
  ENTER();
  return shmsteerGo_stepper_report_gates(H(st), (char *)worker, worker_len);
}

SHMSTEER_API int shmsteer_batch_new(shmsteer_stepper_t *st, const shmsteer_batch_options *opt,
                                    shmsteer_batch_t **out) {
  ENTER();
  OUT_HANDLE(shmsteer_batch_t, shmsteerGo_batch_new(H(st), (shmsteer_batch_options *)opt, &hv), out);
}

SHMSTEER_API int shmsteer_batch_free(shmsteer_batch_t *b) { ENTER(); return shmsteerGo_batch_free(H(b)); }

SHMSTEER_API int shmsteer_batch_reset(shmsteer_batch_t *b) { ENTER(); return shmsteerGo_batch_reset(H(b)); }

SHMSTEER_API int shmsteer_batch_sites(shmsteer_batch_t *b, const int32_t *sites, size_t n) {
  ENTER();
  return shmsteerGo_batch_sites(H(b), (int32_t *)sites, n);
}

SHMSTEER_API int shmsteer_batch_resolve(shmsteer_batch_t *b, uint64_t version, const shmsteer_span *spans,
                                        size_t n_spans, int64_t rows, uint32_t flags, shmsteer_batch_info *out) {
  ENTER();
  if (capi_plan_resolve(H(b), version, spans, n_spans, rows, flags, out)) return SHMSTEER_OK; // plan.c
  return shmsteerGo_batch_resolve(H(b), version, (shmsteer_span *)spans, n_spans, rows, flags, out);
}

SHMSTEER_API int shmsteer_batch_report(shmsteer_batch_t *b, const float *scores, size_t n, uint64_t *gate_checksum) {
  ENTER();
  return shmsteerGo_batch_report(H(b), (float *)scores, n, gate_checksum);
}

SHMSTEER_API int shmsteer_vector_import(shmsteer_t *h, const char *name, size_t name_len, const char *path,
                                        const char *options_json, size_t options_len, uint64_t *version,
                                        uint8_t *digest) {
  ENTER();
  return shmsteerGo_vector_import(H(h), (char *)name, name_len, (char *)path, (char *)options_json, options_len,
                                  version, digest);
}

SHMSTEER_API int shmsteer_vector_import_bytes(shmsteer_t *h, const char *name, size_t name_len, const void *data,
                                              size_t data_len, const char *file_name, const char *options_json,
                                              size_t options_len, uint64_t *version, uint8_t *digest) {
  ENTER();
  return shmsteerGo_vector_import_bytes(H(h), (char *)name, name_len, (void *)data, data_len, (char *)file_name,
                                        (char *)options_json, options_len, version, digest);
}

SHMSTEER_API int shmsteer_vector_export(shmsteer_t *h, const char *name, size_t name_len, const char *path,
                                        const char *format, const char *model_hint) {
  ENTER();
  return shmsteerGo_vector_export(H(h), (char *)name, name_len, (char *)path, (char *)format, (char *)model_hint);
}

SHMSTEER_API int shmsteer_follow(const char *ns, const void *secret, size_t secret_len, const char *secret_file,
                                 int64_t timeout_ms, int64_t poll_ms, uint32_t flags, shmsteer_follower_t **out) {
  ENTER();
  shmsteer_env_secret(&secret, &secret_len, &secret_file);
  OUT_HANDLE(shmsteer_follower_t,
             shmsteerGo_follow((char *)ns, (void *)secret, secret_len, (char *)secret_file, timeout_ms, poll_ms, flags,
                               &hv),
             out);
}

SHMSTEER_API int shmsteer_follower_client(shmsteer_follower_t *f, shmsteer_t **client, uint64_t *generation,
                                          int *dead) {
  ENTER();
  uint64_t hv = 0;
  int rc = shmsteerGo_follower_client(H(f), client ? &hv : NULL, generation, dead);
  if (rc == SHMSTEER_OK && client) *client = (shmsteer_t *)(uintptr_t)hv;
  return rc;
}

SHMSTEER_API int shmsteer_follower_close(shmsteer_follower_t *f) { ENTER(); return shmsteerGo_follower_close(H(f)); }

SHMSTEER_API int shmsteer_capture_attach(const char *ns, const void *secret, size_t secret_len,
                                         const char *secret_file, const char *name, int32_t policy,
                                         int64_t bound_ns, shmsteer_capture_t **out) {
  ENTER();
  shmsteer_env_secret(&secret, &secret_len, &secret_file);
  OUT_HANDLE(shmsteer_capture_t,
             shmsteerGo_capture_attach((char *)ns, (void *)secret, secret_len, (char *)secret_file, (char *)name,
                                       policy, bound_ns, &hv),
             out);
}

SHMSTEER_API int shmsteer_capture_next(shmsteer_capture_t *c, int64_t timeout_ms, shmsteer_capture_event *ev) {
  ENTER();
  return shmsteerGo_capture_next(H(c), timeout_ms, ev);
}

SHMSTEER_API int shmsteer_capture_next_batch(shmsteer_capture_t *c, int64_t timeout_ms, shmsteer_capture_event *evs,
                                             size_t max, size_t *n) {
  ENTER();
  return shmsteerGo_capture_next_batch(H(c), timeout_ms, evs, max, n);
}

SHMSTEER_API int shmsteer_capture_next_run(shmsteer_capture_t *c, int64_t timeout_ms, shmsteer_capture_event *ev,
                                           shmsteer_capture_rec *recs, size_t max, size_t *n) {
  ENTER();
  return shmsteerGo_capture_next_run(H(c), timeout_ms, ev, recs, max, n, 0, NULL, 0, NULL, 0);
}

SHMSTEER_API int shmsteer_capture_copy_run(shmsteer_capture_t *c, int64_t timeout_ms, shmsteer_capture_event *ev,
                                           shmsteer_capture_rec *recs, size_t max, size_t *n, void *dst,
                                           size_t dst_cap, uint32_t *positions, size_t positions_cap) {
  ENTER();
  return shmsteerGo_capture_next_run(H(c), timeout_ms, ev, recs, max, n, 1, dst, dst_cap, positions, positions_cap);
}

SHMSTEER_API int shmsteer_capture_release(shmsteer_capture_t *c) { ENTER(); return shmsteerGo_capture_release(H(c)); }

SHMSTEER_API int shmsteer_capture_publish(shmsteer_capture_t *c, const char *request_id, size_t request_id_len,
                                          int32_t status, const char *error, const char *payload_json,
                                          size_t payload_len) {
  ENTER();
  return shmsteerGo_capture_publish(H(c), (char *)request_id, request_id_len, status, (char *)error,
                                    (char *)payload_json, payload_len);
}

SHMSTEER_API int shmsteer_capture_stats_get(shmsteer_capture_t *c, shmsteer_capture_stats *out) {
  ENTER();
  return shmsteerGo_capture_stats(H(c), out);
}

SHMSTEER_API int shmsteer_capture_close(shmsteer_capture_t *c) { ENTER(); return shmsteerGo_capture_close(H(c)); }

SHMSTEER_API int shmsteer_capture_serve(shmsteer_t *owner, const char *consumers) {
  ENTER();
  return shmsteerGo_capture_serve(H(owner), (char *)consumers);
}

SHMSTEER_API int shmsteer_capture_fs_start(const char *ns, const void *secret, size_t secret_len,
                                           const char *secret_file, const shmsteer_capture_fs_options *opt,
                                           shmsteer_capture_fs_t **out) {
  ENTER();
  shmsteer_env_secret(&secret, &secret_len, &secret_file);
  OUT_HANDLE(shmsteer_capture_fs_t,
             shmsteerGo_capture_fs_start((char *)ns, (void *)secret, secret_len, (char *)secret_file,
                                         (shmsteer_capture_fs_options *)opt, &hv),
             out);
}

SHMSTEER_API int shmsteer_capture_fs_stop(shmsteer_capture_fs_t *fs, shmsteer_capture_fs_stats *out) {
  ENTER();
  return shmsteerGo_capture_fs_stop(H(fs), out);
}

SHMSTEER_API int shmsteer_capture_global(shmsteer_t *owner, const char *name, size_t name_len, const char *spec_json,
                                          size_t spec_len) {
  ENTER();
  return shmsteerGo_capture_global(H(owner), (char *)name, name_len, (char *)spec_json, spec_len);
}

SHMSTEER_API int shmsteer_capture_result_json(shmsteer_t *owner, const char *request_id, size_t request_id_len,
                                              char *buf, size_t cap, size_t *len) {
  ENTER();
  return shmsteerGo_capture_result_json(H(owner), (char *)request_id, request_id_len, buf, cap, len);
}

SHMSTEER_API int shmsteer_stepper_capture_start(shmsteer_stepper_t *st, const shmsteer_capture_options *opt) {
  ENTER();
  return shmsteerGo_stepper_capture_start(H(st), (shmsteer_capture_options *)opt);
}

SHMSTEER_API int shmsteer_stepper_capture_stop(shmsteer_stepper_t *st) {
  ENTER();
  return shmsteerGo_stepper_capture_stop(H(st));
}

SHMSTEER_API int shmsteer_stepper_capture(shmsteer_stepper_t *st, uint32_t hook, int32_t layer, const void *rows,
                                          size_t n_bytes, int32_t dtype, const shmsteer_span *spans, size_t n_spans) {
  ENTER();
  return shmsteerGo_stepper_capture(H(st), hook, layer, (void *)rows, n_bytes, dtype, (shmsteer_span *)spans, n_spans);
}

SHMSTEER_API int shmsteer_batch_capture_plan_get(shmsteer_batch_t *b, shmsteer_batch_capture_plan *out) {
  ENTER();
  return shmsteerGo_batch_capture_plan(H(b), out);
}

SHMSTEER_API int shmsteer_batch_capture(shmsteer_batch_t *b, int32_t site, int32_t dtype, const void *data,
                                        size_t n_bytes) {
  ENTER();
  return shmsteerGo_batch_capture(H(b), site, dtype, (void *)data, n_bytes);
}
