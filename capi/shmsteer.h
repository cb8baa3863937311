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
 * of package shm (10..29), ipc (30..49), steer (50..79) or steer/vecfile (80..99): the error a
 * call returned matches it with errors.Is. shmsteer_error_name gives the Go name
 * ("keys.ErrRevoked"). An error matching several sentinels gets the code of the first in
 * capi/errors.tab's order: ipc, then steer, then vecfile (a vector file whose tensor has the
 * wrong hidden size is HIDDEN_SIZE, though it is also vecfile.ErrShape), then shm; a sentinel
 * that wraps another comes before it (MARKED before NOT_FOUND).
 */
/* BEGIN ERROR CODES: generated from capi/errors.tab by `go generate ./capi`; do not edit */
#define SHMSTEER_OK 0
/* package capi (codes 1..9) */
#define SHMSTEER_E_FORKED 1           /* capi.ErrForked: called in a child forked after the library was loaded */
#define SHMSTEER_E_BUFFER_TOO_SMALL 2 /* capi.ErrBufferTooSmall: *len holds the bytes needed; nothing was written */
#define SHMSTEER_E_INVALID_ARGUMENT 3 /* capi.ErrInvalidArgument: NULL pointer, negative size, bad JSON, bad phase */
#define SHMSTEER_E_BAD_HANDLE 4       /* capi.ErrBadHandle: NULL, closed or foreign handle */
#define SHMSTEER_E_OTHER 5            /* capi.ErrOther: an error matching no sentinel (e.g. a file read) */
/* package shm (codes 10..29) */
#define SHMSTEER_E_NOT_FOUND 10         /* shm.ErrNotFound */
#define SHMSTEER_E_REGION_FULL 11       /* shm.ErrRegionFull: nothing changed; enlarge */
#define SHMSTEER_E_SHM_KEY_TOO_LONG 12  /* shm.ErrKeyTooLong */
#define SHMSTEER_E_BAD_KIND 13          /* shm.ErrBadKind */
#define SHMSTEER_E_SHM_BAD_CONFIG 14    /* shm.ErrBadConfig: a region size is out of range */
#define SHMSTEER_E_NOT_REGION 15        /* shm.ErrNotRegion */
#define SHMSTEER_E_SHM_INCOMPATIBLE 16  /* shm.ErrIncompatible: layout version mismatch */
#define SHMSTEER_E_CORRUPT 17           /* shm.ErrCorrupt */
#define SHMSTEER_E_READ_ONLY 18         /* shm.ErrReadOnly */
#define SHMSTEER_E_BUSY 19              /* shm.ErrBusy: snapshots still open at close */
#define SHMSTEER_E_READER_BUSY 20       /* shm.ErrReaderBusy */
#define SHMSTEER_E_CLOSED 21            /* shm.ErrClosed: the same value as ipc.ErrClosed */
#define SHMSTEER_E_NO_READER_SLOT 22    /* shm.ErrNoReaderSlot: close idle snapshots/readers */
#define SHMSTEER_E_SNAPSHOT_TOO_OLD 23  /* shm.ErrSnapshotTooOld */
#define SHMSTEER_E_SNAPSHOT_FUTURE 24   /* shm.ErrSnapshotFuture */
#define SHMSTEER_E_VALUE_TOO_LARGE 25   /* shm.ErrValueTooLarge */
#define SHMSTEER_E_UNSUPPORTED 26       /* shm.ErrUnsupported: needs Linux memfd */
#define SHMSTEER_E_LEASE_UNAVAILABLE 27 /* shm.ErrLeaseUnavailable: mount /proc (reader lease) */
#define SHMSTEER_E_MARKED 28            /* shm.ErrMarked: a marked key has no value; the key registry reports KEY_REVOKED */
#define SHMSTEER_E_RECLAIM_STALLED 29   /* shm.ErrReclaimStalled: the owner died mid-pass; read at the current version */
/* package ipc (codes 30..36) */
#define SHMSTEER_E_AUTH_SECRET_NOT_DEFINED 30 /* ipc.ErrAuthSecretNotDefined: set SHMSTEER_SECRET */
#define SHMSTEER_E_NOT_YET_INITIALIZED 31     /* ipc.ErrNotYetInitialized: no owner answers */
#define SHMSTEER_E_PREVIOUSLY_INITIALIZED 32  /* ipc.ErrPreviouslyInitialized: owner exists */
#define SHMSTEER_E_AUTH_FAILED 33             /* ipc.ErrAuthFailed: wrong secret or uid */
#define SHMSTEER_E_OWNER_GONE 34              /* ipc.ErrOwnerGone: reads work, writes cannot */
#define SHMSTEER_E_TIMEOUT 35                 /* ipc.ErrTimeout */
#define SHMSTEER_E_INCOMPATIBLE 36            /* ipc.ErrIncompatible: protocol mismatch */
/* package keys (codes 37..40) */
#define SHMSTEER_E_KEY_NOT_FOUND 37       /* keys.ErrNotFound: never set, or purged */
#define SHMSTEER_E_KEY_REVOKED 38         /* keys.ErrRevoked: removed, sentinel stands */
#define SHMSTEER_E_REQUEST_ID_TOO_LONG 39 /* keys.ErrRequestIDTooLong: empty or > 256 B */
#define SHMSTEER_E_KEY_TOO_LARGE 40       /* keys.ErrTooLarge */
/* package ipc (codes 41..49) */
#define SHMSTEER_E_FRAME_TOO_LARGE 41  /* ipc.ErrFrameTooLarge */
#define SHMSTEER_E_UNKNOWN_OP 42       /* ipc.ErrUnknownOp */
#define SHMSTEER_E_PROTOCOL 43         /* ipc.ErrProtocol */
#define SHMSTEER_E_SECRET_FILE 44      /* ipc.ErrSecretFile: unreadable, not a file, too large */
#define SHMSTEER_E_SECRET_CONFLICT 45  /* ipc.ErrSecretConflict: secret given twice */
#define SHMSTEER_E_RENDEZVOUS_TAKEN 46 /* ipc.ErrRendezvousTaken: squatted names (message names holders) */
#define SHMSTEER_E_OWNER_BUSY 47       /* ipc.ErrBusy: frame buffer budget or FrameTimeout */
#define SHMSTEER_E_DEAD_REGION 48      /* ipc.ErrDeadRegion: a Follower reads a dead owner's region */
/* package steer (codes 50..79) */
#define SHMSTEER_E_STEER_INCOMPATIBLE 50 /* steer.ErrIncompatible: model config mismatch */
#define SHMSTEER_E_STEER_BAD_CONFIG 51   /* steer.ErrBadConfig */
#define SHMSTEER_E_BAD_NAME 52           /* steer.ErrBadName */
#define SHMSTEER_E_NON_FINITE 53         /* steer.ErrNonFinite */
#define SHMSTEER_E_HIDDEN_SIZE 54        /* steer.ErrHiddenSize */
#define SHMSTEER_E_UNKNOWN_HOOK 55       /* steer.ErrUnknownHook */
#define SHMSTEER_E_LAYER_RANGE 56        /* steer.ErrLayerRange */
#define SHMSTEER_E_DUPLICATE 57          /* steer.ErrDuplicate */
#define SHMSTEER_E_EMPTY_SET 58          /* steer.ErrEmptySet */
#define SHMSTEER_E_BAD_CLAMP 59          /* steer.ErrBadClamp */
#define SHMSTEER_E_UNKNOWN_VECTOR 60     /* steer.ErrUnknownVector */
#define SHMSTEER_E_BAD_REQUEST_ID 61     /* steer.ErrBadRequestID */
#define SHMSTEER_E_BAD_ENCODING 62       /* steer.ErrBadEncoding */
#define SHMSTEER_E_NOT_OWNER 63          /* steer.ErrNotOwner */
#define SHMSTEER_E_NO_STEP 64            /* steer.ErrNoStep */
#define SHMSTEER_E_BAD_BATCH 65          /* steer.ErrBadBatch */
#define SHMSTEER_E_SHAPE 66              /* steer.ErrShape */
/* 67: retired (steer.ErrDtype, moved to steer/dense; never returned here) */
/* 68: retired (steer.ErrNotContiguous, moved to steer/dense; never returned here) */
#define SHMSTEER_E_REMOTE 69             /* steer.ErrRemote */
#define SHMSTEER_E_OVERFLOW 70           /* steer.ErrOverflow: magnitude beyond steer.MaxMagnitude */
#define SHMSTEER_E_UNKNOWN_REQUEST 71    /* steer.ErrUnknownRequest: a strict request the owner does not know */
#define SHMSTEER_E_NOT_SERVED 72         /* steer.ErrNotServed: the owner never called Owner.Serve */
#define SHMSTEER_E_LATCH_STATE 73        /* steer.ErrLatchState: restored latch state does not fit */
#define SHMSTEER_E_PROBE_SITE 74         /* steer.ErrProbeSite: a probe names exactly one (hook, layer) */
#define SHMSTEER_E_BATCH_CAPACITY 75     /* steer.ErrBatchCapacity: a batch does not fit the tables: raise max_slots / max_clamps */
#define SHMSTEER_E_BAD_GATE 76           /* steer.ErrBadGate: a malformed steering gate (the message names the gate and field) */
#define SHMSTEER_E_GATE_UNSUPPORTED 77   /* steer.ErrGateUnsupported: attenuate + probe + this_token: use next_step or rest_of_request */
#define SHMSTEER_E_BAD_MODEL_HINT 78     /* steer.ErrBadModelHint: a model hint over 256 bytes, not UTF-8 or not printable */
#define SHMSTEER_E_CAPTURE_CONSUMER 79   /* steer.ErrCaptureConsumer: a capture names a consumer the owner does not declare */
/* package vecfile (codes 80..99) */
#define SHMSTEER_E_FILE_TOO_LARGE 80  /* vecfile.ErrTooLarge: above max_bytes; nothing was read */
#define SHMSTEER_E_UNKNOWN_FORMAT 81  /* vecfile.ErrUnknownFormat: not gguf, npy, npz, safetensors */
#define SHMSTEER_E_FILE_CORRUPT 82    /* vecfile.ErrCorrupt: truncated or malformed file */
#define SHMSTEER_E_FILE_DTYPE 83      /* vecfile.ErrDtype: element type not converted */
#define SHMSTEER_E_FILE_SHAPE 84      /* vecfile.ErrShape: not [hidden] or [layers, hidden] */
#define SHMSTEER_E_VALUE_RANGE 85     /* vecfile.ErrValueRange: a float64 beyond float32 */
#define SHMSTEER_E_TENSOR_NAME 86     /* vecfile.ErrTensorName: names no hook and layer */
#define SHMSTEER_E_NEED_LAYERS 87     /* vecfile.ErrNeedLayers: a [hidden] array needs "layers" */
#define SHMSTEER_E_NO_VECTORS 88      /* vecfile.ErrNoVectors: the file steers nothing */
#define SHMSTEER_E_UNREPRESENTABLE 89 /* vecfile.ErrUnrepresentable: pick another format */
#define SHMSTEER_E_FILE_OPTIONS 90    /* vecfile.ErrBadOptions: bad scale, layers or max_bytes */
/* package capture (codes 100..139) */
#define SHMSTEER_E_CAPTURE_BAD_SPEC 100       /* capture.ErrBadSpec: a capture spec is not its consumer's JSON */
#define SHMSTEER_E_CAPTURE_BAD_CONSUMER 101   /* capture.ErrBadConsumer: a consumer name outside [a-zA-Z0-9._-] or too long */
#define SHMSTEER_E_CAPTURE_BAD_SLUG 102       /* capture.ErrBadSlug: a tag or request_id cannot name a directory */
#define SHMSTEER_E_CAPTURE_UNKNOWN_HOOK 103   /* capture.ErrUnknownHook: a spec names a hook the model does not have */
#define SHMSTEER_E_CAPTURE_LAYER_RANGE 104    /* capture.ErrLayerRange: a spec's layer or range is outside the model */
#define SHMSTEER_E_CAPTURE_EMPTY_SELECTOR 105 /* capture.ErrEmptySelector: a hook or position selector selects nothing */
#define SHMSTEER_E_CAPTURE_BAD_POSITIONS 106  /* capture.ErrBadPositions: an unknown positions selector */
#define SHMSTEER_E_CAPTURE_POSITION_RANGE 107 /* capture.ErrPositionRange: a position outside the prompt, or prompt_len < 1 */
#define SHMSTEER_E_CAPTURE_BAD_LAYOUT 108     /* capture.ErrBadLayout: layout is not per_file or packed */
#define SHMSTEER_E_CAPTURE_BAD_RECORD 109     /* capture.ErrBadRecord: a captured record does not describe its bytes */
#define SHMSTEER_E_CAPTURE_FINISHED 110       /* capture.ErrFinished: a request's capture files were already finished */
#define SHMSTEER_E_CAPTURE_WRITE 111          /* capture.ErrWrite: a capture file could not be written (space, permissions) */
#define SHMSTEER_E_CAPTURE_CONSUMER_TYPE 112  /* capture.ErrConsumerType: a declaration NAME=TYPE names an unknown type */
#define SHMSTEER_E_RING_LAYOUT 113            /* capture.ErrRingLayout: not a capture ring of this version */
#define SHMSTEER_E_RING_CORRUPT 114           /* capture.ErrRingCorrupt: a ring frame does not fit the ring */
#define SHMSTEER_E_CAPTURE_DROPPED 115        /* capture.ErrDropped: a record was dropped for a lagging consumer */
#define SHMSTEER_E_RECORD_TOO_LARGE 116       /* capture.ErrRecordTooLarge: a record larger than half the ring */
#define SHMSTEER_E_NO_RING_SLOT 117           /* capture.ErrNoSlot: every consumer slot of the ring is taken */
#define SHMSTEER_E_BAD_POLICY 118             /* capture.ErrBadPolicy: a consumer's policy is not block or drop, or its bound is negative */
#define SHMSTEER_E_CAPTURE_BAD_RESULT 119     /* capture.ErrBadResult: a published result with a bad status, payload or request id */
#define SHMSTEER_E_UNKNOWN_CONSUMER 120       /* capture.ErrUnknownConsumer: an attaching consumer names none the owner declares */
#define SHMSTEER_E_CONSUMER_TAKEN 121         /* capture.ErrConsumerTaken: a consumer of that name is attached already */
#define SHMSTEER_E_NO_HUB 122                 /* capture.ErrNoHub: the owner serves no capture: declare a consumer */
#define SHMSTEER_E_HUB_PROTOCOL 123           /* capture.ErrHubProtocol: a capture connection's message does not parse */
#define SHMSTEER_E_HUB_GONE 124               /* capture.ErrHubGone: the owner's hub closed the capture connection; attach again */
#define SHMSTEER_E_CAPTURE_BAD_RUN 125        /* capture.ErrBadRun: a run's bounds are out of range (max records, bytes or rows) */
#define SHMSTEER_E_CAPTURE_RUN_TOO_LARGE 126  /* capture.ErrRunTooLarge: the next record is larger than the reader's buffers; nothing was consumed */
/* package shm (codes 140..149) */
#define SHMSTEER_E_COLUMNS_FULL 140 /* shm.ErrColumnsFull: no free column (or no pool); end requests, unpin, or raise Columns */
#define SHMSTEER_E_BAD_COLUMN 141   /* shm.ErrBadColumn: a column not reserved by this transaction, or a cell out of range */
/* package steer (codes 150..169) */
#define SHMSTEER_E_CAPTURE_SPEC_TOO_LARGE 150 /* steer.ErrCaptureSpecTooLarge: a consumer's capture spec is larger than steer.MaxCaptureSpec */
/* One past the largest code. */
#define SHMSTEER_E_LIMIT 170
/* END ERROR CODES */

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

/* ---- Activation capture at the hooks (workers; package capture's ring) ----
 *
 * A stepper that captures copies, at each hooked site and before steering it, the rows the
 * step's admitted requests capture (their consumers' position selectors read each span's
 * first_position) into this worker's capture ring, one record per (site, request) per step;
 * consumers read the ring (shmsteer_capture_attach). shmsteer_stepper_apply captures the
 * float32 blocks it steers; shmsteer_stepper_capture takes a block of another dtype (a site is
 * captured once per step); a device worker gathers the rows its batch's capture plan lists
 * (shmsteer_batch_capture_plan) and hands each site's back (shmsteer_batch_capture). */
typedef struct {
  uint64_t ring_bytes; /* the ring's data bytes (a record takes at most half); 0: 64 MiB */
  int64_t wait_ns;     /* the longest a record waits for a lagging block consumer; 0: 10 ms */
  int32_t rank;        /* this process's tensor-parallel rank */
  int32_t writer_rank; /* the one rank that writes (the residual is the same on every rank): 0 */
} shmsteer_capture_options;

/* Start capturing at st's hooks: a ring of its own, registered with the owner's hub (the
 * owner's own steppers in process). opt NULL: defaults, rank 0. A rank other than writer_rank
 * makes no ring and captures nothing. NO_HUB when the owner serves no capture; INVALID_ARGUMENT
 * for a negative rank or wait. Starting again replaces the ring. */
int shmsteer_stepper_capture_start(shmsteer_stepper_t *st, const shmsteer_capture_options *opt);
/* Stop capturing; the ring is closed (consumers are told it is gone). */
int shmsteer_stepper_capture_stop(shmsteer_stepper_t *st);
/* Capture (hook, layer)'s rows of rows[0:n_bytes], a row-major T x hidden block of dtype
 * SHMSTEER_CAPTURE_F32, _BF16 or _F16 (raw little-endian elements), before steering it. Nothing
 * happens unless st captures; arguments are checked as shmsteer_stepper_apply's (NO_STEP,
 * SHAPE, UNKNOWN_HOOK, LAYER_RANGE, BAD_BATCH). A ring that drops a record does not fail it. */
int shmsteer_stepper_capture(shmsteer_stepper_t *st, uint32_t hook, int32_t layer, const void *rows,
                             size_t n_bytes, int32_t dtype, const shmsteer_span *spans, size_t n_spans);

/* A batch's capture plan of its last resolve: the sites whose rows to copy (ascending), and
 * for sites[i] the block rows rows[start[i]:start[i+1]] (grouped per request). Every pointer
 * is valid until the next resolve or free, NULL when n_sites is 0 (nothing to capture). */
typedef struct {
  const int32_t *sites;
  size_t n_sites;
  const int32_t *start; /* n_sites + 1 */
  const int32_t *rows;
  size_t n_rows;
} shmsteer_batch_capture_plan;

int shmsteer_batch_capture_plan_get(shmsteer_batch_t *b, shmsteer_batch_capture_plan *out);
/* Hand back site's gathered rows: data holds exactly the rows the plan lists for site, in that
 * order, of dtype SHMSTEER_CAPTURE_* (n_bytes = rows x hidden x element size), copied before
 * the site's steering add (on a GPU: one device-to-host copy into pinned memory). Valid from a
 * resolve until the next (the step may have ended). SHAPE for another length, LAYER_RANGE for a
 * site out of range. */
int shmsteer_batch_capture(shmsteer_batch_t *b, int32_t site, int32_t dtype, const void *data, size_t n_bytes);

/* ---- Activation capture consumers (package capture) ----
 *
 * A consumer attaches to the owner under a name the owner declares and reads every worker's
 * capture ring: a stream of events, one per shmsteer_capture_next. A captured request's BEGIN
 * (its spec for this consumer, JSON, and its prompt length) comes before its RECORDs (one site
 * of one request in one step: rows x width elements of dtype, their absolute positions) and its
 * END after all of them (dropped: records dropped for this consumer while it was open). A
 * record's data and positions point into the ring (zero copy) and its strings into the handle's
 * memory: all valid until the next call on the handle (release frees the record earlier).
 * Publish the request's result after its END. One thread at a time per handle. */
typedef struct shmsteer_capture shmsteer_capture_t; /* a capture consumer */

#define SHMSTEER_CAPTURE_NONE 0   /* no event within the timeout */
#define SHMSTEER_CAPTURE_BEGIN 1
#define SHMSTEER_CAPTURE_RECORD 2
#define SHMSTEER_CAPTURE_END 3

#define SHMSTEER_CAPTURE_BLOCK 1 /* a worker waits up to the bound for this consumer, then drops */
#define SHMSTEER_CAPTURE_DROP 2  /* a worker drops at once when this consumer lags */

#define SHMSTEER_CAPTURE_F32 1
#define SHMSTEER_CAPTURE_BF16 2 /* raw bfloat16 elements (read them as uint16) */
#define SHMSTEER_CAPTURE_F16 3

#define SHMSTEER_CAPTURE_OK 1            /* result statuses a consumer publishes */
#define SHMSTEER_CAPTURE_PARTIAL_ERROR 2
#define SHMSTEER_CAPTURE_ERROR 3

typedef struct {
  int32_t kind;               /* SHMSTEER_CAPTURE_NONE, _BEGIN, _RECORD, _END */
  uint32_t ring;              /* RECORD: the worker ring it came from */
  const char *request_id;     /* not NUL-terminated */
  size_t request_id_len;
  const char *spec;           /* BEGIN: this consumer's spec (JSON), not NUL-terminated */
  size_t spec_len;
  int64_t prompt_len;         /* BEGIN */
  uint64_t dropped;           /* END */
  int32_t layer;              /* RECORD */
  int32_t dtype;              /* RECORD: SHMSTEER_CAPTURE_F32, _BF16, _F16 */
  const char *hook;           /* RECORD, not NUL-terminated */
  size_t hook_len;
  int64_t rows, width;        /* RECORD */
  const uint32_t *positions;  /* RECORD: rows absolute positions, little-endian */
  const void *data;           /* RECORD: rows x width elements, little-endian */
  size_t nbytes;
  /* For readers that map a ring once and slice it: the ring's data area (the same for every
   * record of the ring while it lives) and the record's offsets in it; ids a reader can cache
   * names by: request_seq (this consumer's number for the request, the same in its BEGIN,
   * RECORDs and END) and hook_seq (this consumer's number for the hook name). */
  const void *ring_base;
  size_t ring_len;
  size_t data_off, positions_off;
  uint32_t request_seq, hook_seq;
} shmsteer_capture_event;

typedef struct {
  int64_t rings;     /* worker rings read */
  uint64_t received; /* records read */
  uint64_t dropped;  /* records dropped while this consumer lagged */
  uint64_t skipped;  /* records of requests not captured for it */
  uint64_t lag;      /* most bytes not yet released on any ring */
} shmsteer_capture_stats;

/* Attach a consumer named name (declared by the owner) with policy SHMSTEER_CAPTURE_BLOCK or
 * _DROP and its bound on a worker's wait in nanoseconds (0: the worker's). The secret as for
 * shmsteer_attach. Errors: UNKNOWN_CONSUMER, CONSUMER_TAKEN, NO_HUB,
 * BAD_POLICY, and shmsteer_attach's. */
int shmsteer_capture_attach(const char *ns, const void *secret, size_t secret_len, const char *secret_file,
                            const char *name, int32_t policy, int64_t bound_ns, shmsteer_capture_t **out);
/* The next event, waiting at most timeout_ms (kind NONE: none came). */
int shmsteer_capture_next(shmsteer_capture_t *c, int64_t timeout_ms, shmsteer_capture_event *ev);
/* Up to max events (1..65536) into evs, *n set (0: none within the timeout): the first as
 * shmsteer_capture_next returns it, then, if it is a RECORD, the records that follow it. Every
 * record's views stay valid until the next call on the handle. */
int shmsteer_capture_next_batch(shmsteer_capture_t *c, int64_t timeout_ms, shmsteer_capture_event *evs, size_t max,
                                size_t *n);
/* Runs: many records in one call, described by one array instead of one event each, for a
 * reader that handles them together (one strided view, one copy). A run is records of one
 * ring with the same hook, dtype, rows and width (ev names the hook); rec i of a run: */
typedef struct {
  uint32_t request_seq;   /* the consumer's number for the request (its BEGIN's and END's) */
  uint32_t hook_seq;      /* the consumer's number for the hook name (the run's, ev->hook_seq) */
  int32_t layer;
  uint32_t reserved;      /* 0 */
  uint64_t data_off;      /* next_run: offset of its rows in the ring's data area (ev->ring_base);
                           * copy_run: in dst (i x ev->nbytes) */
  uint64_t positions_off; /* next_run: offset of its rows x uint32 positions in the ring's data area;
                           * copy_run: index of its first position in positions (i x ev->rows) */
} shmsteer_capture_rec;

/* The next event into *ev as shmsteer_capture_next gives it, and *n = 0, unless it is a RECORD:
 * then ev describes the run's first record (and so its ring, dtype, rows, width and nbytes,
 * shared by the run, and ring_base, ring_len) and recs[0..*n) the run, up to max (1..65536)
 * records whose data and positions lie at one stride in the ring's data area: recs[i].data_off
 * = recs[0].data_off + i x stride, the same for positions_off, so one strided view covers the
 * run (zero copy). A run ends before a record of another shape, the ring's wrap-around or a
 * BEGIN. Views are valid until the next call on the handle, as next_batch's: after
 * shmsteer_capture_release or the next call the worker may overwrite them at any time (a view
 * read then returns whatever was written since), and after shmsteer_capture_close they are
 * unmapped. INVALID_ARGUMENT for NULL pointers or max out of range (nothing consumed). */
int shmsteer_capture_next_run(shmsteer_capture_t *c, int64_t timeout_ms, shmsteer_capture_event *ev,
                              shmsteer_capture_rec *recs, size_t max, size_t *n);
/* shmsteer_capture_next_run, copying the run out: its records may span the ring's wrap-around;
 * their data go to dst back to back (record i at i x ev->nbytes, *n x ev->nbytes bytes in all,
 * at most dst_cap) and their positions to positions (rows each, at most positions_cap), and the
 * records are released before it returns: nothing of the ring is referenced after it (ev->data
 * and ev->positions are NULL). A next record larger than dst_cap bytes or positions_cap rows
 * alone: CAPTURE_RUN_TOO_LARGE with ev->nbytes and ev->rows set to what it needs, nothing
 * consumed. INVALID_ARGUMENT for NULL pointers or max out of range (nothing consumed). */
int shmsteer_capture_copy_run(shmsteer_capture_t *c, int64_t timeout_ms, shmsteer_capture_event *ev,
                              shmsteer_capture_rec *recs, size_t max, size_t *n, void *dst, size_t dst_cap,
                              uint32_t *positions, size_t positions_cap);
/* Let the worker reuse the records the last next or next_batch returned. */
int shmsteer_capture_release(shmsteer_capture_t *c);
/* Publish the result for a request: status SHMSTEER_CAPTURE_OK, _PARTIAL_ERROR or _ERROR, an
 * error message (C string or NULL) and a payload, a JSON array (NULL/0: []). */
int shmsteer_capture_publish(shmsteer_capture_t *c, const char *request_id, size_t request_id_len, int32_t status,
                             const char *error, const char *payload_json, size_t payload_len);
int shmsteer_capture_stats_get(shmsteer_capture_t *c, shmsteer_capture_stats *out);
/* Detach from every ring and the owner (its requests not published end with status error). */
int shmsteer_capture_close(shmsteer_capture_t *c);

/* Owner: serve capture consumers, declared as "NAME=TYPE[,NAME=TYPE...]" (type filesystem), as
 * serve's --capture-consumer: admissions may name them from now on. Errors, the owner unchanged
 * (it serves no capture; a later call may declare again): INVALID_ARGUMENT (an empty list, or
 * the owner serves capture already), CAPTURE_CONSUMER_TYPE (an entry without "=" or of an
 * unknown type), CAPTURE_BAD_CONSUMER (a bad name, one declared twice, too many), NOT_OWNER. */
int shmsteer_capture_serve(shmsteer_t *owner, const char *consumers);
/* Owner, after shmsteer_capture_serve: give declared consumer name a global spec (JSON), applied
 * to every request admitted from now on that does not name it (a request's own spec replaces
 * it); filesystem: its FilesystemCaptureRequest without request_id (each request is written
 * under its own id). Checked as a request's spec is: its typed error changes nothing.
 * Requests it cannot apply to (no prompt_len, say) are admitted, that consumer's result error. */
int shmsteer_capture_global(shmsteer_t *owner, const char *name, size_t name_len, const char *spec_json,
                            size_t spec_len);
/* Owner: every declared consumer's result for a request, JSON {consumer: {"status": "pending" |
 * "ok" | "partial_error" | "error" | "not_requested", "error": msg or null, "payload": [...]}}
 * into (buf, cap); *len is set (BUFFER_TOO_SMALL: retry with *len). */
int shmsteer_capture_result_json(shmsteer_t *owner, const char *request_id, size_t request_id_len, char *buf,
                                 size_t cap, size_t *len);

/* ---- The filesystem consumer in this process ----
 *
 * What `shmsteer capture fs` runs, on threads of the library: a consumer attached to the owner of
 * (secret, ns) that writes each captured request under root/{tag}/{request_id}/ in the vLLM
 * fork's layout and publishes the paths it wrote as the request's result; when the owner
 * restarts or drops it, it attaches again. For hosts without the command (the Python package). */
typedef struct shmsteer_capture_fs shmsteer_capture_fs_t;

typedef struct {
  const char *root;   /* C string: the directory the files go under (created; required) */
  const char *name;   /* C string: the consumer name the owner declares; NULL or "" = "fs" */
  const char *layout; /* C string: "per_file" or "packed", for specs that name none; NULL = per_file */
  int32_t policy;     /* SHMSTEER_CAPTURE_BLOCK or _DROP */
  int64_t bound_ns;   /* longest a worker's append waits for it (BLOCK); 0: the worker's */
  int32_t fsync;      /* nonzero: fsync each file and its directory before publishing it */
} shmsteer_capture_fs_options;

typedef struct {
  uint64_t requests, ok, partial, failed; /* requests begun; their results */
  uint64_t records, bytes;                /* records and bytes written */
} shmsteer_capture_fs_stats;

/* Attach and start writing; the secret as for shmsteer_attach. .tmp files a killed consumer
 * left under root are removed first. Errors: INVALID_ARGUMENT (NULL opt or out, no root),
 * CAPTURE_BAD_LAYOUT, BAD_POLICY, CAPTURE_WRITE (root cannot be made), and
 * shmsteer_capture_attach's (UNKNOWN_CONSUMER, CONSUMER_TAKEN, NO_HUB, ...). Stop it with
 * shmsteer_capture_fs_stop. */
int shmsteer_capture_fs_start(const char *ns, const void *secret, size_t secret_len, const char *secret_file,
                              const shmsteer_capture_fs_options *opt, shmsteer_capture_fs_t **out);
/* Stop and free fs: requests not ended are abandoned (their .tmp files removed); *out (may be
 * NULL) gets the counters. An error that stopped it earlier (a secret the owner refuses, say) is
 * returned here. */
int shmsteer_capture_fs_stop(shmsteer_capture_fs_t *fs, shmsteer_capture_fs_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* SHMSTEER_H */
