// The C plan of a stepper's plain sites (plan.c): internal to the library, shared by capi.c's
// wrappers and the Go side (plan.go). Not part of the ABI.
#ifndef SHMSTEER_PLAN_H
#define SHMSTEER_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "shmsteer.h"

// One add of a plain site (steer.PlainAdd): rows [start, end) of the block get v (kind
// CAPI_ADD_EACH: to each row; CAPI_ADD_BLOCK: v holds end-start rows, row to row) or v + g
// (CAPI_ADD_PAIR), each sum rounded to float32 once. v and g point into the region's mapping.
typedef struct {
  const float *v, *g;
  int64_t start, end;
  int32_t kind;
  int32_t reserved;
} capi_plan_add;

enum { CAPI_ADD_EACH = 0, CAPI_ADD_BLOCK = 1, CAPI_ADD_PAIR = 2 };

typedef struct capi_plan capi_plan; // opaque to Go

// What C did with a stepper since Go last looked (capi_plan_settle), in C memory: Go passes
// no pointer of its own and crosses into C once for all of it.
typedef struct {
  const uint32_t *trail;  // the sites C applied, in order (ntrail); from cbase on, a step C began
  const uint32_t *csites; // the applies of each step C began and ended (ncsites)
  uint64_t csteps;        // steps C began and ended
  uint64_t dsteps;        // device-path steps C answered, of batch dbatch
  uint64_t dbatch;
  uint32_t ntrail, ncsites;
  uint32_t cbase; // UINT32_MAX: no step C began is open
  int32_t ended;  // C ended the step Go began (its pin released)
} capi_plan_settled;

capi_plan *capi_plan_register(uint64_t h, int32_t d, int32_t layers, int32_t nsites);
void capi_plan_unregister(capi_plan *p);
int capi_plan_open(capi_plan *p, uint64_t gen, const shmsteer_span *spans, size_t n);
void capi_plan_close(capi_plan *p);
// capi_plan_settle takes what C did since Go last looked (the trail, C's end of Go's step, the
// steps C began and ended, the device steps it answered), closing the plan first unless keep.
// The answer stays valid until the plan's next call.
const capi_plan_settled *capi_plan_settle(capi_plan *p, int keep);
int capi_plan_is_open(const capi_plan *p);
uint64_t capi_plan_gen(const capi_plan *p);
int capi_plan_spans_equal(const capi_plan *p, const shmsteer_span *spans, size_t n);
capi_plan_add *capi_plan_site_reserve(capi_plan *p, uint32_t n);
void capi_plan_site_commit(capi_plan *p, uint32_t site, uint32_t n);
int capi_plan_site_ready(const capi_plan *p, uint32_t site);
void capi_plan_set_pin(capi_plan *p, uint64_t *pin, uint64_t ver);
int capi_plan_arm_end(capi_plan *p);
void capi_plan_end_sum(capi_plan *p, uint64_t sum);
uint32_t capi_plan_end_order(const capi_plan *p, const uint32_t **sites);
void capi_plan_expect_end(capi_plan *p, const uint32_t *sites, uint32_t n, uint64_t sum);

void capi_plan_arm_resolve(capi_plan *p, uint64_t batch, int64_t rows, uint64_t ver, uint64_t sum,
                           uint64_t *ver_word, uint64_t *horizon_word);
void capi_plan_disarm(capi_plan *p, int all);
int capi_plan_res_ok(const capi_plan *p);
void capi_plan_rearm(capi_plan *p);
const shmsteer_span *capi_plan_step(const capi_plan *p, size_t *n, const char **ids, uint64_t *batch, int64_t *rows,
                                    uint64_t *ver);
void capi_plan_adopted(capi_plan *p);
void capi_plan_arm_device(capi_plan *p, uint64_t batch, int64_t rows, uint64_t ver, uint64_t *ver_word,
                          uint64_t *horizon_word, const shmsteer_span *spans, size_t n, const shmsteer_batch_info *info);

// shmsteer_stepper_end's fast path: 1 when the plan ended the native step (checksum set), 0
// when Go must.
int capi_plan_end(uint64_t h, uint64_t *checksum);

// shmsteer_batch_resolve's fast path: 1 when the plan began the native step of batch handle bh,
// or answered its device-path step (out set), 0 when Go must.
int capi_plan_resolve(uint64_t bh, uint64_t version, const shmsteer_span *spans, size_t n, int64_t rows, uint32_t flags,
                      shmsteer_batch_info *out);

// The wrappers' fast path: 1 when the plan applied (hook, layer) to rows (float32, or bfloat16
// when bf16), 0 when Go must.
int capi_plan_apply(uint64_t h, uint32_t hook, int32_t layer, void *rows, size_t n, int bf16,
                    const shmsteer_span *spans, size_t n_spans);

#endif
