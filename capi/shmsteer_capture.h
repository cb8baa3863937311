/*
 * shmsteer_capture.h: the activation capture part of the C ABI (shmsteer.h's contract holds
 * here too). Include shmsteer.h, which includes this file inside its extern "C" block.
 */
#ifndef SHMSTEER_CAPTURE_H
#define SHMSTEER_CAPTURE_H

#ifndef SHMSTEER_H
#error "include shmsteer.h, not shmsteer_capture.h"
#endif

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

#endif /* SHMSTEER_CAPTURE_H */
