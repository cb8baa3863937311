/*
 * shmsteer.h — the C ABI of shmsteer (libshmsteer.so), ABI version 4 (SHMSTEER_ABI_VERSION).
 *
 * shmsteer keeps per-request secret keys and activation-steering vectors in one shared-memory
 * region: an owner process writes it, worker processes attach with a shared secret and read it
 * lock-free. This library is the Go implementation itself (go build -buildmode=c-shared), so C,
 * C++ and Python read the same bytes the same way as Go. Build it with `go generate ./capi`;
 * the library and this header land in python/shmsteer/.
 *
 * CONVENTIONS
 *  - Every function returns an int status: SHMSTEER_OK (0) or one of the SHMSTEER_E_* codes
 *    below. Outputs go through pointer arguments and are written only on SHMSTEER_OK (except
 *    the *len of SHMSTEER_E_BUFFER_TOO_SMALL, which reports the size needed).
 *  - shmsteer_last_error() describes the last failure of the calling thread (thread-local). It
 *    never contains the secret.
 *  - Strings are (pointer, length) pairs and need not be NUL-terminated, except where a
 *    parameter is documented as a C string. The library never keeps a pointer you pass in after
 *    the call returns, and never frees memory you own.
 *  - Handles (shmsteer_t, shmsteer_snapshot_t, shmsteer_stepper_t, shmsteer_reader_t) are opaque
 *    and owned by the caller until the matching close/free call. A closed handle is never reused
 *    for another object within the process's lifetime of 2^32 handle generations: using it
 *    gives SHMSTEER_E_BAD_HANDLE, not another object.
 *  - Thread safety: shmsteer_t and shmsteer_snapshot_t may be used from any number of threads at
 *    once. A shmsteer_stepper_t and a shmsteer_reader_t belong to one thread at a time.
 *
 * FORK AND SPAWN
 *  The Go runtime inside this library does not survive fork(): only the forking thread exists in
 *  the child, and Go's own threads (scheduler, GC, network poller) are gone. A process that
 *  forks after loading the library therefore gets SHMSTEER_E_FORKED from every call in the child,
 *  checked in C before anything enters Go, so the child never hangs. Start worker processes
 *  with fork+exec (posix_spawn, subprocess) or Python multiprocessing's "spawn" (or
 *  "forkserver" started before the library is loaded) start method, and load the library in the
 *  new process. A child forked BEFORE the library was loaded is unaffected.
 *
 * MEMORY RETURNED BY THE LIBRARY
 *  - Vector views (shmsteer_vector_entry.data) point into the read-only shared mapping: zero
 *    bytes are copied, writing through them faults (the pages are mapped PROT_READ). They are
 *    valid until the snapshot they came from is closed.
 *  - Effective views (shmsteer_effective.data and .global_data) point into the read-only shared
 *    mapping too: the owner composes each request's steering, and the global steering, once,
 *    and every process reads those floats in place (zero bytes copied). Valid until the
 *    stepper's next begin/end/free.
 */
#ifndef SHMSTEER_H
#define SHMSTEER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SHMSTEER_ABI_VERSION 4

/* The longest message shmsteer_last_error returns, NUL included. */
#define SHMSTEER_ERRMSG_MAX 1024

/*
 * ERROR CODES. Codes 1..9 belong to the C ABI; every other code is exactly one Go sentinel error
 * of package shm (10..29, 140..149), ipc (30..36, 41..49), keys (37..40), steer (50..79,
 * 150..169), steer/vecfile (80..99) or capture (100..139), as shmsteer_errors.h lists them: the
 * error a call returned matches it with errors.Is. shmsteer_error_name gives the Go name
 * ("keys.ErrRevoked"). An error matching several sentinels gets the code of the first in
 * capi/errors.tab's order: ipc, then steer, then vecfile (a vector file whose tensor has the
 * wrong hidden size is HIDDEN_SIZE, though it is also vecfile.ErrShape), then shm; a sentinel
 * that wraps another comes before it (MARKED before NOT_FOUND).
 */
#include "shmsteer_errors.h" /* generated from capi/errors.tab by `go generate ./capi` */

/* Phases of a request's rows (steer.Phase). */
#define SHMSTEER_PHASE_PREFILL 1
#define SHMSTEER_PHASE_DECODE 2

typedef struct shmsteer shmsteer_t;                   /* an attached client or an owner */
typedef struct shmsteer_snapshot shmsteer_snapshot_t; /* a pinned region version */
typedef struct shmsteer_stepper shmsteer_stepper_t;   /* per-thread step state */
typedef struct shmsteer_batch shmsteer_batch_t;       /* a stepper's per-step batch tables */
typedef struct shmsteer_reader shmsteer_reader_t;     /* per-thread key reader */
typedef struct shmsteer_follower shmsteer_follower_t; /* a client following owner restarts */

/* ---- library ---------------------------------------------------------------------------- */

/* SHMSTEER_ABI_VERSION of the loaded library; compare with the header's. Never fails. */
int shmsteer_abi_version(void);

/* The calling thread's last error message (empty after a success). The pointer stays valid
 * for the thread's lifetime; its text until the thread's next shmsteer call. */
const char *shmsteer_last_error(void);

/* The Go name of a code ("keys.ErrRevoked", "capi.ErrForked"), or NULL for an unknown code.
 * Static storage; never fails; usable in a forked child. */
const char *shmsteer_error_name(int code);

/* ---- attach and owner ------------------------------------------------------------------- */

/* The secret is (secret, secret_len) when secret != NULL, or the file at C string secret_file
 * when not NULL (its content, one trailing newline "\n" or "\r\n" stripped: Go's
 * ipc.SecretFromFile, the one reader every process uses); both given: SECRET_CONFLICT. With
 * neither, the environment: SHMSTEER_SECRET or the file SHMSTEER_SECRET_FILE names (both set:
 * SECRET_CONFLICT). Nothing set: SHMSTEER_E_AUTH_SECRET_NOT_DEFINED; a file that cannot be
 * used: SECRET_FILE.
 * ns is a C string (NULL = ""). The library keeps no copy of the secret after attaching. */

/* Attach to the owner serving (secret, ns). timeout_ms bounds the attach and each later RPC
 * (0 = 5 s). Errors: AUTH_SECRET_NOT_DEFINED, NOT_YET_INITIALIZED (no owner), AUTH_FAILED
 * (wrong secret), INCOMPATIBLE, TIMEOUT. Release *out with shmsteer_close. */
int shmsteer_attach(const char *ns, const void *secret, size_t secret_len, const char *secret_file,
                    int64_t timeout_ms, shmsteer_t **out);

/* Owner settings; zero fields take the defaults. */
typedef struct {
  int32_t hidden;        /* model hidden size (required, >= 1) */
  int32_t layers;        /* number of layers (required, >= 1) */
  const char *hooks;     /* C string, comma-separated hook names; NULL = pre_attn,post_attn,
                            post_block,mlp_in,mlp_out */
  int64_t index_slots;   /* power of two; 0 = 65536 */
  int64_t arena_bytes;   /* multiple of 64; 0 = 256 MiB */
  int64_t reader_slots;  /* 0 = the shm default */
  int64_t grace_ms;      /* revoked-key sentinel lifetime before purge; 0 = 60 s */
  int64_t max_key_bytes; /* 0 = 4096 */
} shmsteer_owner_config;

/* Start an owner in this process: create the region (with the model config recorded in it),
 * serve attaches and worker RPCs (key writes, vector registration) on goroutines of this
 * process, purge revoked keys after grace. Errors: PREVIOUSLY_INITIALIZED (an owner already
 * serves this secret and namespace), AUTH_SECRET_NOT_DEFINED, STEER_BAD_CONFIG,
 * SHM_BAD_CONFIG. Stop it with shmsteer_close (attached clients then get OWNER_GONE on writes
 * and keep reading the last state). */
int shmsteer_owner_start(const char *ns, const void *secret, size_t secret_len,
                         const char *secret_file, const shmsteer_owner_config *cfg,
                         shmsteer_t **out);

/* Detach a client or stop an owner, and free h. Close snapshots and steppers of h first: they
 * fail with CLOSED afterwards. Readers of h left open are closed and freed with it: later calls
 * through them return BAD_HANDLE without reading anything (shmsteer_reader_close on one too,
 * and it does nothing); a reader opened later never answers to a freed one's handle. Do not use
 * h's readers from another thread while h closes. */
int shmsteer_close(shmsteer_t *h);

/* Round trip to the owner: OK while it serves, OWNER_GONE after it died (owner: always OK). */
int shmsteer_ping(shmsteer_t *h);

/* ---- follower --------------------------------------------------------------------------- */

/* shmsteer_follow's flags. READY_SERVE: switch to a restarted owner only once its region is
 * ready, that is once `shmsteer serve` has restored its persisted state (the check Go workers
 * make with ipc.FollowOptions.Ready = serve.IsReady); meanwhile the old region stays readable. */
#define SHMSTEER_FOLLOW_READY_SERVE 1u

/* Attach as shmsteer_attach and follow the owner of (secret, ns) across its restarts: when the
 * owner dies the current client keeps reading its last region (flagged dead) while the
 * follower re-attaches with backoff, checking every poll_ms (0 = 100 ms). The secret as for
 * shmsteer_attach. With READY_SERVE the first attach too waits, up to timeout_ms, for a ready
 * region (TIMEOUT). Errors as shmsteer_attach's. Release with shmsteer_follower_close. */
int shmsteer_follow(const char *ns, const void *secret, size_t secret_len, const char *secret_file,
                    int64_t timeout_ms, int64_t poll_ms, uint32_t flags, shmsteer_follower_t **out);

/* The current client (*client, a shmsteer_t for every read and step call), its generation (1 for
 * the first attach, +1 at each re-attach; may be NULL) and whether its owner is known to be gone
 * (*dead = 1: reads see the last state; may be NULL). Take it once per unit of work (a step)
 * and use it throughout: a replaced client stays usable for 10 s. The follower owns the
 * shmsteer_t it returns: do not close it. */
int shmsteer_follower_client(shmsteer_follower_t *f, shmsteer_t **client, uint64_t *generation, int *dead);

/* Stop following and close every client the follower handed out. */
int shmsteer_follower_close(shmsteer_follower_t *f);

/* The model config recorded in the region. Any output may be NULL. */
int shmsteer_model(shmsteer_t *h, int32_t *hidden, int32_t *layers, int32_t *num_hooks);

/* The id of hook C string name (for stepper calls). UNKNOWN_HOOK if the model has none. */
int shmsteer_hook_id(shmsteer_t *h, const char *name, uint32_t *id);

/* The last published region version (what a scheduler hands to every rank). */
int shmsteer_version(shmsteer_t *h, uint64_t *version);

/* A JSON object: {"owner": bool, "owner_pid": n, "model": {...}, "steer": {steer.Status},
 * "region": {shm.Stats}}, written to buf (not NUL-terminated; *len = its length). If cap is too
 * small: BUFFER_TOO_SMALL and *len = the size needed. */
int shmsteer_status_json(shmsteer_t *h, char *buf, size_t cap, size_t *len);

/* ---- keys -------------------------------------------------------------------------------- */

/* Copy request id's key into buf[0:cap] and set *len. KEY_NOT_FOUND (never set, or purged) and
 * KEY_REVOKED (removed; its sentinel stands until the grace period ends) are distinct. If cap is
 * too small: BUFFER_TOO_SMALL, *len = the key's length, nothing written. A cap of at least key
 * length + 1 avoids any copy inside the library. Lock-free, reads the mapping; any thread. */
int shmsteer_key_get(shmsteer_t *h, const char *id, size_t id_len, void *buf, size_t cap,
                     size_t *len);

/* Set request id's key (replacing a key or a revoked sentinel). In a client this is an RPC to
 * the owner (OWNER_GONE if it died). Errors: REQUEST_ID_TOO_LONG, KEY_TOO_LARGE, REGION_FULL. */
int shmsteer_key_set(shmsteer_t *h, const char *id, size_t id_len, const void *key,
                     size_t key_len);

/* Revoke request id's key: from now on gets return KEY_REVOKED, and the owner purges the entry
 * after the grace period (then KEY_NOT_FOUND). KEY_NOT_FOUND if it had no key. */
int shmsteer_key_remove(shmsteer_t *h, const char *id, size_t id_len);

/* The request ids with a key or a standing sentinel, as JSON [{"id": s, "revoked": b}, ...];
 * buf/cap/len as for shmsteer_status_json. */
int shmsteer_key_list_json(shmsteer_t *h, char *buf, size_t cap, size_t *len);

/* The fast path for bindings whose per-argument call cost dominates (Python ctypes): one
 * argument less in, none out. id is a C string (an id containing a NUL byte cannot use it). On
 * success returns the key's length (>= 0) and the key is in the calling thread's key buffer,
 * shmsteer_key_buffer() (SHMSTEER_KEY_BUFFER_BYTES; valid until the thread's next get there);
 * on failure returns minus the error code (-SHMSTEER_E_KEY_REVOKED, ...;
 * -SHMSTEER_E_BUFFER_TOO_SMALL for a key longer than the buffer: use shmsteer_key_get). */
#define SHMSTEER_KEY_BUFFER_BYTES 8192
int64_t shmsteer_key_get_tls(shmsteer_t *h, const char *id);
void *shmsteer_key_buffer(void); /* the calling thread's buffer; NULL only when out of memory */

/* A reader owns a reader slot: the fastest key path for one thread (no slot compare-and-swap).
 * Free it with shmsteer_reader_close (shmsteer_close of h frees those left open). Its gets of a
 * live key that fits the buffer are answered in C, without entering the Go runtime, by a reader
 * generated from the engine's layout table; every other case (revoked, not found, too small,
 * ...) is answered by the engine as before, with the same results. */
int shmsteer_reader_open(shmsteer_t *h, shmsteer_reader_t **out);
int shmsteer_reader_key_get(shmsteer_reader_t *r, const char *id, size_t id_len, void *buf,
                            size_t cap, size_t *len); /* as shmsteer_key_get */
/* shmsteer_key_get_tls through a reader: the key in the thread's key buffer, as there. */
int64_t shmsteer_reader_key_get_tls(shmsteer_reader_t *r, const char *id);
int shmsteer_reader_close(shmsteer_reader_t *r);

/* One key of a shmsteer_reader_key_get_many call: the caller fills id/id_len (the request id)
 * and buf/cap (where its key goes); the call sets len (the key's length, or the size needed
 * when rc is SHMSTEER_E_BUFFER_TOO_SMALL) and rc (SHMSTEER_OK or the code
 * shmsteer_reader_key_get would return for this id alone: KEY_NOT_FOUND, KEY_REVOKED, ...). */
typedef struct {
  const char *id;
  size_t id_len;
  void *buf;
  size_t cap;
  size_t len;
  int rc;
} shmsteer_key_get_item;

/* Gets the keys of n ids through r, each answered as shmsteer_reader_key_get answers it (in C
 * for a live key that fits, else by the engine); each item's result is exactly that of
 * shmsteer_reader_key_get for it. Returns SHMSTEER_OK when every item has its
 * own rc (some may have failed: check each; the thread's last error message is that of the last
 * item that failed), or an error for the call itself (a bad handle, items NULL with n > 0),
 * which sets no item. */
int shmsteer_reader_key_get_many(shmsteer_reader_t *r, shmsteer_key_get_item *items, size_t n);

/* ---- snapshots and vector views --------------------------------------------------------- */

/* Pin version (0 = the current one; else a version published earlier, e.g. the one the
 * scheduler handed to every rank) and set *pinned to it. While pinned, nothing it references is
 * reclaimed. SNAPSHOT_TOO_OLD / SNAPSHOT_FUTURE for a version that cannot be pinned;
 * NO_READER_SLOT when every slot is in use. */
int shmsteer_snapshot_open(shmsteer_t *h, uint64_t version, shmsteer_snapshot_t **out,
                           uint64_t *pinned);

/* Unpin and free s. Every view taken from s is invalid afterwards. */
int shmsteer_snapshot_close(shmsteer_snapshot_t *s);

/* One entry of a named vector: at (hook, layer) add scale * data[0:len]. */
typedef struct {
  uint32_t hook;     /* hook id (shmsteer_hook_id) */
  int32_t layer;
  float scale;
  const float *data; /* views: into the read-only mapping; register: caller memory */
  size_t len;        /* = the hidden size */
} shmsteer_vector_entry;

typedef struct {
  uint64_t version;   /* region version that wrote it */
  uint8_t digest[32]; /* sha256 of its encoding */
  size_t n_entries;
} shmsteer_vector_info;

/* View named vector name at snapshot s: fill *info and entries[0:n_entries] (zero-copy: each
 * data points into the mapping). If cap < n_entries: BUFFER_TOO_SMALL with info->n_entries
 * set. UNKNOWN_VECTOR if no vector has that name at s. */
int shmsteer_vector_view(shmsteer_snapshot_t *s, const char *name, size_t name_len,
                         shmsteer_vector_info *info, shmsteer_vector_entry *entries, size_t cap);

/* The named vectors at s, as JSON [{"name": s, "version": n, "digest": hex[, "model_hint": s]},
 * ...] (model_hint when the vector has one). */
int shmsteer_vector_list_json(shmsteer_snapshot_t *s, char *buf, size_t cap, size_t *len);

/* Register (or replace: last writer wins) named vector name from entries[0:n] (copied). In a
 * client this is an RPC to the owner. *version (may be NULL) = the region version that wrote it. */
int shmsteer_vector_register(shmsteer_t *h, const char *name, size_t name_len,
                             const shmsteer_vector_entry *entries, size_t n, uint64_t *version);
int shmsteer_vector_unregister(shmsteer_t *h, const char *name, size_t name_len,
                               uint64_t *version);

/* Probe vectors: named vectors of kind "probe" (read by gates, never added), in a namespace of
 * their own (a probe and a steering vector may share a name). The same calls as named vectors;
 * a probe names exactly one (hook, layer): n must be 1, else PROBE_SITE. */
int shmsteer_probe_view(shmsteer_snapshot_t *s, const char *name, size_t name_len,
                        shmsteer_vector_info *info, shmsteer_vector_entry *entries, size_t cap);
int shmsteer_probe_list_json(shmsteer_snapshot_t *s, char *buf, size_t cap, size_t *len);
int shmsteer_probe_register(shmsteer_t *h, const char *name, size_t name_len,
                            const shmsteer_vector_entry *entries, size_t n, uint64_t *version);
int shmsteer_probe_unregister(shmsteer_t *h, const char *name, size_t name_len,
                              uint64_t *version);

/* ---- vector files ----------------------------------------------------------------------- */

/* Register (or replace) named vector name from the vector file at C string path: a llama.cpp
 * GGUF control vector, .npy, .npz or safetensors, read by steer/vecfile.Import for the model
 * recorded in the region (see the vecfile package doc for layouts, tensor names and the
 * hook each steers). The file is read by this process (a client sends the vectors to the owner
 * as shmsteer_vector_register does). (options_json, options_len) is a JSON object, every field
 * optional (options_len 0 = all defaults; unknown fields are INVALID_ARGUMENT):
 *   {"scale": f,        multiplies every value, as llama.cpp's --control-vector-scaled
 *                       (default 1; 0 and non-finite are FILE_OPTIONS)
 *    "layers": "A-B",   keep layers A..B inclusive (or "A"), as --control-vector-layer-range
 *    "hook": s,         the hook GGUF directions, plain arrays and "layers.N" tensors steer
 *                       (default "post_block": llama.cpp adds a direction to the block output)
 *    "format": s,       "gguf", "npy", "npz" or "safetensors" (default: magic bytes, then
 *                       the extension)
 *    "max_bytes": n,    size cap, checked before anything is read (default 4 GiB)
 *    "model_hint": s}   the model hint stored with the vector (default: a GGUF file's
 *                       controlvector.model_hint, none for other formats; "" for none): at
 *                       most 256 bytes of printable UTF-8, else BAD_MODEL_HINT
 * *version (may be NULL) = the region version that wrote it; digest (may be NULL, else 32
 * bytes of caller memory) = the sha256 of its encoding, as shmsteer_vector_view reports.
 * Nothing is registered on error. Errors: the vecfile codes (FILE_TOO_LARGE, UNKNOWN_FORMAT,
 * FILE_CORRUPT, FILE_DTYPE, FILE_SHAPE, VALUE_RANGE, TENSOR_NAME, NEED_LAYERS, NO_VECTORS,
 * FILE_OPTIONS), the model mismatches HIDDEN_SIZE, LAYER_RANGE, UNKNOWN_HOOK, NON_FINITE,
 * DUPLICATE, then those of shmsteer_vector_register; OTHER when the file cannot be opened.
 * The message names the file, the tensor and the expected shape. */
int shmsteer_vector_import(shmsteer_t *h, const char *name, size_t name_len, const char *path,
                           const char *options_json, size_t options_len, uint64_t *version,
                           uint8_t *digest);

/* shmsteer_vector_import for a file held in memory: data[0:data_len] (read during the call,
 * never retained) holds the file's bytes and C string file_name names it in messages and for
 * detection by extension ("format" in the options overrides both). max_bytes caps data_len.
 * Bindings that read a format the Go importer cannot (Python's .pt through torch.load) pass
 * its tensors here as safetensors or .npy bytes, so every rule (names, shapes, layer ranges,
 * dtypes, scale, caps) is the importer's. Errors as shmsteer_vector_import's. */
int shmsteer_vector_import_bytes(shmsteer_t *h, const char *name, size_t name_len, const void *data,
                                 size_t data_len, const char *file_name, const char *options_json,
                                 size_t options_len, uint64_t *version, uint8_t *digest);

/* Write named vector name, read at a snapshot of the current version that stays pinned until
 * the file is written, to C string path (created or truncated, mode 0644; removed again on
 * error) in C string format "gguf", "npy", "npz" or "safetensors" (NULL or "" = by path's
 * extension). Import of the file gives back the same floats bitwise. GGUF holds only
 * post_block at layers >= 1 and npy one hook: UNREPRESENTABLE otherwise (use npz or
 * safetensors). A GGUF file's controlvector.model_hint is C string model_hint, or the hint
 * stored with the vector when model_hint is NULL ("" writes none). Errors: UNKNOWN_VECTOR,
 * UNKNOWN_FORMAT, UNREPRESENTABLE, BAD_MODEL_HINT, OTHER (I/O). */
int shmsteer_vector_export(shmsteer_t *h, const char *name, size_t name_len, const char *path,
                           const char *format, const char *model_hint);

/* The model hint stored with named vector name at snapshot s (a GGUF's
 * controlvector.model_hint, kept by imports; empty when it has none): its UTF-8 bytes in
 * buf[0:cap] (no NUL) with *len their count; BUFFER_TOO_SMALL with *len set when they do not
 * fit. UNKNOWN_VECTOR if no vector has that name at s. */
int shmsteer_vector_model_hint(shmsteer_snapshot_t *s, const char *name, size_t name_len, char *buf,
                               size_t cap, size_t *len);

/* ---- steering writes (owner) ----------------------------------------------------------- */

/* Steering JSON (steer.Steering): {"base": T, "prefill": T, "decode": T, "compose": n} with
 * T = {"vectors": [{"hook": s, "layer": n, "scale": f, "data": [f, ...]}],
 *      "refs": [{"name": s, "strength": f}],
 *      "clamps": [{"hook": s, "layer": n, "dir": [f, ...], "min": f, "max": f, "strength": f}]}.
 * Unknown fields are refused (INVALID_ARGUMENT). */

/* Replace the global steering ("{}" clears). In a client the owner does the write (a Go or a
 * C/Python owner alike) and validates it again; NOT_SERVED if that owner serves no steering. */
int shmsteer_global_set_json(shmsteer_t *h, const char *json, size_t json_len, uint64_t *version);

/* Admit request id: admission JSON {"tenant": s, "conversation": s, "override": Steering,
 * "steering": [gate]}, all optional (owner only). A gate is the vLLM fork's {"when", "scope",
 * "apply"} (see steer.DecodeGates); an inline source is the fork's {"kind": "inline", "packed":
 * {hook: packed}} with packed its SteeringHookPacked {"dtype", "shape", "layer_indices",
 * "data" (base64), "scales"?} or a list [{"layer": n, "scale": s, "data": [floats]}].
 * Refusals: BAD_GATE, GATE_UNSUPPORTED, NON_FINITE, UNKNOWN_VECTOR, PROBE_SITE. */
int shmsteer_request_admit_json(shmsteer_t *h, const char *id, size_t id_len, const char *json,
                                size_t json_len, uint64_t *version);

/* Check a request's gates without an engine or a model: json[0:json_len] is the admission
 * JSON's "steering" value (a list of gates as above, null, or empty: no gates), read exactly as
 * an admission reads it (steer.DecodeGates, inline sources packed or in the vector form), so a
 * value refused here is refused by every owner's admission with the same code and message, and
 * one accepted here is refused at admission only for what needs the owner and its model: a
 * named vector it does not have (UNKNOWN_VECTOR), a probe not at one site (PROBE_SITE), an
 * inline vector's hook, layer, width or values, an add's magnitude. *n_gates (NULL: not
 * written) gets the number of gates. Errors: BAD_GATE (a malformed gate, a value that is not a
 * list, more than 64 gates, an inline source that does not unpack), GATE_UNSUPPORTED (attenuate
 * with a this_token probe), NON_FINITE (a threshold, sharpness or strength), BAD_NAME (a vector
 * name too long), INVALID_ARGUMENT (text that is not one JSON value, NULL json with json_len >
 * 0); the message names the gate and the field. Usable in any process that loaded the library,
 * owner or not (a frontend checking a request before it reaches the owner). */
int shmsteer_gates_check(const char *json, size_t json_len, size_t *n_gates);

/* shmsteer_gates_check, plus what an admission checks against the vectors registered at
 * snapshot s and the region's model (steer.Engine.CheckGatesAt), changing nothing: every named
 * source registered at s (a probe vector for a probe, a steering vector for an add:
 * UNKNOWN_VECTOR), each probe at exactly one (hook, layer) (PROBE_SITE), every inline vector's
 * hook, layer, width and values (UNKNOWN_HOOK, LAYER_RANGE, HIDDEN_SIZE, NON_FINITE, ...), an
 * add's magnitude (OVERFLOW). id[0:id_len] (may be empty) names the request in the messages as
 * an admission of that id does (`request "id": steering[0]...`); empty names none
 * (`steering[0]...`). A value refused here is refused by an admission at s with the same code
 * and message; an admission also bounds the request's steering and gates together (OVERFLOW),
 * which needs the owner's latches. Usable with a snapshot of an owner or of a client (a frontend
 * checking a request before it reaches the owner). *n_gates (NULL: not written) gets the
 * number of gates. */
int shmsteer_gates_check_at(shmsteer_snapshot_t *s, const char *id, size_t id_len, const char *json,
                            size_t json_len, size_t *n_gates);

/* What an admission did (steer.Admitted). source: where the request's steering came from,
 * SHMSTEER_SOURCE_NONE (no request steering), _OVERRIDE (its own), _LATCH (its conversation's
 * latch, bridged), _COMPOSED (the latch bridged with its override added). */
#define SHMSTEER_SOURCE_NONE 0
#define SHMSTEER_SOURCE_OVERRIDE 1
#define SHMSTEER_SOURCE_LATCH 2
#define SHMSTEER_SOURCE_COMPOSED 3
typedef struct {
  uint64_t version;   /* the region version that published it */
  int32_t source;     /* SHMSTEER_SOURCE_* */
  uint8_t latched;    /* 1: the override was latched onto the conversation (the latch triggered) */
  uint8_t refused;    /* 1: the override was too large to latch (it still steers this request) */
  uint8_t replaced;   /* 1: the id was admitted and not ended: this admission replaced its entry */
  uint8_t reserved;   /* 0 */
  uint8_t digest[32]; /* sha256 of the published request entry (zeros for SOURCE_NONE) */
} shmsteer_admitted;

/* shmsteer_request_admit_json that reports what the admission did in *out (NULL: nothing), its
 * version in out->version. Re-admitting a live id replaces it (out->replaced = 1). */
int shmsteer_request_admit_result(shmsteer_t *h, const char *id, size_t id_len, const char *json,
                                  size_t json_len, shmsteer_admitted *out);

/* Tiers of shmsteer_admit_vector: base (prefill and decode rows), prefill, decode. */
#define SHMSTEER_TIER_BASE 0
#define SHMSTEER_TIER_PREFILL 1
#define SHMSTEER_TIER_DECODE 2

/* An inline vector of an admission's override, passed by address: at (hook, layer) of tier,
 * add scale * data[0:len] to the request's rows. */
typedef struct {
  uint32_t tier;     /* SHMSTEER_TIER_* */
  uint32_t hook;     /* hook id (shmsteer_hook_id) */
  int32_t layer;
  float scale;       /* 1: the floats as given */
  const float *data; /* caller memory, read (copied once) during the call only */
  size_t len;        /* = the hidden size */
} shmsteer_admit_vector;

/* shmsteer_request_admit_result with the override's inline vectors passed as float32 buffers
 * instead of JSON float lists: json is the admission JSON (may be empty) for everything else
 * (tenant, conversation, override refs, clamps and compose, steering, capture, prompt_len), and
 * vectors[0:n_vectors] are appended to the override's tiers after any vectors it lists (an
 * override is made when json has none). Validated as the JSON vectors are, in the same pass.
 * Errors: INVALID_ARGUMENT (NULL vectors with n_vectors > 0, NULL data with len > 0, a tier
 * not SHMSTEER_TIER_*), UNKNOWN_HOOK, HIDDEN_SIZE (len), LAYER_RANGE, NON_FINITE, DUPLICATE,
 * and every refusal of shmsteer_request_admit_json; nothing is admitted then. */
int shmsteer_request_admit_binary(shmsteer_t *h, const char *id, size_t id_len, const char *json,
                                  size_t json_len, const shmsteer_admit_vector *vectors,
                                  size_t n_vectors, shmsteer_admitted *out);

/* A projection clamp of an admission's override, passed by address: at (hook, layer) of tier,
 * each row's projection p on the unit direction u = dir / |dir| is moved by
 * strength * (clamp(p, min, max) - p) along u. */
typedef struct {
  uint32_t tier;    /* SHMSTEER_TIER_* */
  uint32_t hook;    /* hook id (shmsteer_hook_id) */
  int32_t layer;
  float min;        /* min <= max */
  float max;
  float strength;   /* in [0, 1]; 1: clamped exactly */
  const float *dir; /* caller memory, read (copied once) during the call only */
  size_t len;       /* = the hidden size */
} shmsteer_admit_clamp;

/* shmsteer_request_admit_binary with the override's clamps passed by address too:
 * clamps[0:n_clamps] are appended to the override's tiers after any clamps the JSON lists, in
 * their order (a tier's clamps apply in order, so pass a tier's clamps all one way). Validated as
 * the JSON clamps are, in the same pass. Errors: those of shmsteer_request_admit_binary, for a
 * clamp as for a vector (INVALID_ARGUMENT for NULL clamps with n_clamps > 0 or a NULL dir,
 * UNKNOWN_HOOK, HIDDEN_SIZE, LAYER_RANGE, NON_FINITE), and BAD_CLAMP (min > max, a zero
 * direction, a strength outside [0, 1]); nothing is admitted then. */
int shmsteer_request_admit_buffers(shmsteer_t *h, const char *id, size_t id_len, const char *json,
                                   size_t json_len, const shmsteer_admit_vector *vectors,
                                   size_t n_vectors, const shmsteer_admit_clamp *clamps,
                                   size_t n_clamps, shmsteer_admitted *out);

/* End request id: its steering entry is removed (owner only). */
int shmsteer_request_end(shmsteer_t *h, const char *id, size_t id_len, uint64_t *version);

/* ---- step apply ------------------------------------------------------------------------- */

/* Rows [start, end) of a block belong to request id, in phase SHMSTEER_PHASE_*. Spans of one
 * call must not share a row (BAD_BATCH); an empty span (start == end) holds none. */
typedef struct {
  const char *id;
  size_t id_len;
  int64_t start, end;
  int32_t phase;
  int32_t first_position; /* the absolute token position of row start (the request's tokens
                             computed before this step); capture's position selectors read it.
                             It fills what was padding: zero-initialise spans ({0} or designated
                             initializers), as older callers' 0 means position 0. */
} shmsteer_span;

/* A stepper (steer.Stepper) caches each request's composed steering in private memory. One
 * thread at a time; free with shmsteer_stepper_free. */
int shmsteer_stepper_new(shmsteer_t *h, shmsteer_stepper_t **out);
int shmsteer_stepper_free(shmsteer_stepper_t *st);

/* strict != 0: the stepper's apply, bind and batch resolve fail with UNKNOWN_REQUEST when a span
 * names a request with no admitted entry (never admitted, ended, mistyped) and change nothing;
 * 0 (the default): such rows get the global steering only, counted in unknown_requests. Call it
 * between steps. */
int shmsteer_stepper_set_strict(shmsteer_stepper_t *st, int32_t strict);

/* Begin a step at version (0 = current; ranks handed the same version apply the same steering)
 * and set *pinned (may be NULL). */
int shmsteer_stepper_begin(shmsteer_stepper_t *st, uint64_t version, uint64_t *pinned);

/* Add each span's effective steering at (hook, layer) to its rows of rows[0:n_floats], a
 * row-major T x hidden float32 block in the caller's memory, then apply clamps: in place, with
 * the AVX-512/AVX2 kernels, no copy. Every argument is checked before rows is written
 * (BAD_BATCH, SHAPE, UNKNOWN_HOOK, LAYER_RANGE, NO_STEP). */
int shmsteer_stepper_apply(shmsteer_stepper_t *st, uint32_t hook, int32_t layer, float *rows,
                           size_t n_floats, const shmsteer_span *spans, size_t n_spans);

/* shmsteer_stepper_apply on a bfloat16 block: rows[0:n_values], T x hidden bfloat16 values
 * (uint16 bit patterns, a torch.bfloat16 tensor's memory). The spanned rows are widened to
 * float32 inside the library, steered as shmsteer_stepper_apply steers them, and narrowed back
 * rounding to nearest even (the bits of .float(), apply and copy_ back), in one call; elements
 * the steering leaves unchanged and rows outside every span keep their bits. Capture records
 * the rows as bfloat16. The same errors, checksum and counts as shmsteer_stepper_apply. */
int shmsteer_stepper_apply_bf16(shmsteer_stepper_t *st, uint32_t hook, int32_t layer, uint16_t *rows,
                                size_t n_values, const shmsteer_span *spans, size_t n_spans);

/* Bind spans, the batch of a block of n_rows rows, as the current step's batch for
 * shmsteer_stepper_apply_bound: validated as shmsteer_stepper_apply validates it
 * (INVALID_ARGUMENT, BAD_BATCH, SHAPE, NO_STEP; after BAD_BATCH or SHAPE no batch is bound) and
 * copied (spans may be reused at once). It lasts until the step ends, the next bind, or an
 * apply with other spans. */
int shmsteer_stepper_bind(shmsteer_stepper_t *st, const shmsteer_span *spans, size_t n_spans,
                          size_t n_rows);

/* shmsteer_stepper_apply with the bound batch, which is neither converted nor compared again:
 * rows[0:n_floats] must be the bound block, n_rows x hidden floats (SHAPE); NO_STEP when the
 * step has no batch bound. The same floats and checksum as shmsteer_stepper_apply. */
int shmsteer_stepper_apply_bound(shmsteer_stepper_t *st, uint32_t hook, int32_t layer, float *rows,
                                 size_t n_floats);

/* A request's effective steering at (hook, layer, phase) in the current step: a row gets
 * data[i] + global_data[i] added (each term only if not NULL), then the clamps. */
typedef struct {
  const float *data;        /* the request's own steering, composed: NULL or len floats of the
                               shared mapping (read-only) */
  size_t len;               /* the hidden size (0 when data and global_data are both NULL) */
  const float *global_data; /* the global steering, composed: NULL or len floats of the mapping */
  uint32_t clamps;          /* clamps applied after the add (a plain add is not the whole effect) */
  uint64_t version;         /* newest region version among its inputs */
  uint8_t digest[32];       /* identifies its inputs: equal digest, equal floats */
} shmsteer_effective;

int shmsteer_stepper_effective(shmsteer_stepper_t *st, const char *id, size_t id_len,
                               uint32_t hook, int32_t layer, int32_t phase,
                               shmsteer_effective *out);

/* End the step (unpin) and set *checksum (may be NULL): the determinism checksum of the
 * actions applied, equal across ranks that applied the same steering to the same layouts. */
int shmsteer_stepper_end(shmsteer_stepper_t *st, uint64_t *checksum);

/* A stepper's counters (steer.StepStats) and its current or last step's gate decisions. */
typedef struct {
  uint64_t steps, applies, recomposes, missing_refs, unknown_requests;
  uint64_t gate_evaluations;    /* probe reads: one per request per probe gate per step */
  uint64_t gate_fires;          /* probe gates that fired (this_token: per row) */
  uint64_t gate_reports_missed; /* device-path steps whose scores never came */
  uint64_t gate_scopes[4][3];   /* per scope (this_token, next_step, rest_of_request,
                                   rest_of_conversation): evaluations, fires, engaged */
  uint64_t gate_checksum;       /* the gate decisions of the current or last step: the same for a
                                   native step and a device-path step (after its report) */
} shmsteer_step_stats;

int shmsteer_stepper_stats(shmsteer_stepper_t *st, shmsteer_step_stats *out);

/* Send the stepper's gate counts (its stats' gate_scopes and gate_reports_missed, cumulative)
 * to the owner as worker `worker` (1..64 bytes, e.g. "rank0"): serve sums its workers' reports
 * into /v1/status, shmsteer status and /metrics. Under tensor parallelism report from one rank.
 * NOT_SERVED from an owner that does not collect them (or when this process is the owner). */
int shmsteer_stepper_report_gates(shmsteer_stepper_t *st, const char *worker, size_t worker_len);

/* ---- per-step batch (device workers) ---------------------------------------------------- */

/* A batch resolves a whole step in one call (steer.Batch): every distinct (request, phase)
 * composition of the step gets a slot, row `slot` of a per-site table [slots + 1, hidden] the
 * worker keeps on its device (row 0 zeros, global + request composed into one row), and the
 * call reports the slot of every row, the sites anything steers, and exactly the table rows to
 * (re)write. A hooked site then does one gather-add, table[index], with no call here. */
typedef struct {
  uint32_t max_slots;      /* compositions a table holds besides row 0; 0 = 256 */
  int32_t max_clamps;      /* clamp directions per (slot, site); 0 = 4, -1 = none */
  uint32_t max_gate_slots; /* distinct probe gates a gate table holds besides row 0; 0 = 64 */
  int32_t max_row_gates;   /* probe gates of one request in a step (gate columns); 0 = 4, -1 = none */
} shmsteer_batch_options;

/* opt may be NULL (defaults). The batch belongs to st's thread; free it before st. */
int shmsteer_batch_new(shmsteer_stepper_t *st, const shmsteer_batch_options *opt, shmsteer_batch_t **out);
int shmsteer_batch_free(shmsteer_batch_t *b);
/* Forget what the worker's tables hold: the next resolve reports every steered row. */
int shmsteer_batch_reset(shmsteer_batch_t *b);
/* Restrict the batch to the n sites (hook * layers + layer) the worker applies (n = 0: all):
 * nothing is staged or reported for the others. A site added later starts as zeros (a new
 * table); drop the table of a site removed. LAYER_RANGE for a site out of range. */
int shmsteer_batch_sites(shmsteer_batch_t *b, const int32_t *sites, size_t n);

#define SHMSTEER_BATCH_END 1u   /* end the step after resolving (no CPU apply follows) */
#define SHMSTEER_BATCH_RESET 2u /* shmsteer_batch_reset first (the worker's tables are new) */
/* A native step: resolve for shmsteer_stepper_apply and shmsteer_stepper_apply_bf16 only. out
 * gets version and checksum (the checksum a full resolve of the same batch and sites gives),
 * every other field zero; no slot, staged row, gate or capture plan changes. A CPU worker's
 * resolve touches a fraction of the memory a device worker's does. */
#define SHMSTEER_BATCH_NATIVE 4u

/* A resolve's declarative gates (steer/batch_gates.go). What a step's gates do to a request's
 * rows as a whole (attenuation, engaged adds) is already in the tables above; what depends on
 * this step's residual is a gate column per probe gate of a request: the worker keeps a gate
 * table [slots, hidden] of probe rows, per gate slot (threshold, sharpness, probe site,
 * per_row), and per hooked site a table [slots, hidden] of add rows, all zeros at first and
 * written only from updates and adds. Per step: gate[t][k] = score[t][k] = 0; at each hooked
 * site S in forward order, before the site's gather-add, for each column k whose slot j =
 * rows[t * cols + k] probes at S: score[t][k] = h[t] . probe[j], and when j is per_row gate[t][k]
 * = factor[t * cols + k] * sigmoid(sharpness[j] * (score[t][k] - threshold[j])); after the gather-add, h[t] += gate[t][k]
 * * add_S[j] for each k; then the clamps. After the forward, when report is 1, hand score back
 * with shmsteer_batch_report. */
typedef struct {
  uint32_t cols;              /* gate columns per row (0: no probe gate in the step) */
  uint32_t slots;             /* highest gate slot of the step + 1: rows a gate table needs */
  const int32_t *rows;        /* rows x cols: the gate slot of each row's column (0: none) */
  const int32_t *updates;     /* n_updates x 4 int32: slot, probe_site, per_row, 0 */
  size_t n_updates;
  const float *probe;         /* n_updates x hidden: the slot's probe vector (times its scale) */
  const float *params;        /* n_updates x 2: threshold, sharpness */
  const int32_t *adds;        /* n_adds x 2 int32: site, slot (write add_stage's row there) */
  size_t n_adds;
  const float *add_stage;     /* n_adds x hidden */
  const int32_t *sites;       /* n_sites sites where this step's gate slots probe or add */
  size_t n_sites;
  uint32_t report;            /* 1: the step has gated decode rows, call shmsteer_batch_report */
  const float *factor;        /* rows x cols: gate[t][k] is multiplied by factor[t * cols + k] (the
                                 request's attenuation, 1 unless an attenuate gate is engaged) */
} shmsteer_batch_gates;

/* What a resolve produced. Every pointer is valid until the next resolve, reset or free of the
 * batch, and NULL when its count is 0. */
typedef struct {
  uint64_t version;            /* region version the step pinned */
  uint64_t checksum;           /* determinism checksum of the resolved batch (not of floats) */
  const int32_t *index;        /* rows entries: the slot of each row (0: nothing steers it) */
  size_t rows;
  uint32_t slots;              /* highest slot of this step + 1: table rows needed */
  const int32_t *sites;        /* n_sites steered sites (hook * layers + layer), ascending */
  const int32_t *site_clamps;  /* clamp directions at each of sites (0: a plain add) */
  size_t n_sites;
  const int32_t *updates;      /* n_updates x 4 int32: site, slot, clamps, clamp_start */
  size_t n_updates;
  const float *stage;          /* n_updates x hidden: the composed row each update writes */
  const float *clamp_dirs;     /* n_clamps x hidden unit directions; an update's clamps are
                                  records [clamp_start, clamp_start + clamps), applied in order */
  const float *clamp_params;   /* n_clamps x 3: lo, hi, strength */
  size_t n_clamps;
  shmsteer_batch_gates gates;  /* the step's declarative gates */
} shmsteer_batch_info;

/* Begin a step at version (0 = current), as shmsteer_stepper_begin, and resolve spans over a
 * block of rows rows into *out: the one call per step a device worker makes. The step stays
 * open for shmsteer_stepper_apply on CPU sites unless flags has SHMSTEER_BATCH_END. On error
 * (BAD_BATCH, BATCH_CAPACITY, ...) the step is ended and the batch's slots are unchanged. */
int shmsteer_batch_resolve(shmsteer_batch_t *b, uint64_t version, const shmsteer_span *spans, size_t n_spans,
                           int64_t rows, uint32_t flags, shmsteer_batch_info *out);

/* Hand the step's probe scores back (out->gates.report was 1): scores is rows x cols float32
 * (NULL when cols is 0). The host-evaluated scopes (next_step, rest_of_request,
 * rest_of_conversation) decide on the mean of a request's rows and advance to the next step, the
 * decisions are counted (the stepper's stats) and summed into *gate_checksum (may be NULL), the
 * same sum a native step of the same decisions gives. Once per such resolve, before the next one
 * (a step never reported counts as gate_reports_missed, its probes as not fired). NO_STEP when no
 * step awaits its scores, SHAPE for a wrong n; nothing changes then. */
int shmsteer_batch_report(shmsteer_batch_t *b, const float *scores, size_t n, uint64_t *gate_checksum);

/* The activation capture functions (shmsteer_capture_*, shmsteer_stepper_capture, ...). */
#include "shmsteer_capture.h"

#ifdef __cplusplus
}
#endif
#endif /* SHMSTEER_H */
