//go:build cgo

// The site apply that does not enter the Go runtime. A stepper's plain sites (steer.PlainSite:
// a site whose whole program is adds, no gate, clamp or capture) are kept here, in C memory,
// once Go has applied them (plan.go exports each after its Go apply); while the step's batch
// and the program's generation hold, shmsteer_stepper_apply and shmsteer_stepper_apply_bf16
// run such a site here and note it in the plan's trail. Go replays the trail (steer's Replay:
// the checksum fold and the stats) before anything else reads or changes the stepper, and
// closes the plan whenever the step's state moves (an end, a begin, another batch, capture, a
// device-path resolve, an error). Every check the Go apply makes is made here first (the
// site's range, the block's shape and rows, the same spans as the resolved batch, byte for
// byte); whatever fails one goes to Go, which answers it as before.
//
// A native step (a native resolve, SHMSTEER_BATCH_NATIVE) whose every apply ran here ends here
// too (shmsteer_stepper_end, capi_plan_end), while its applies are the same sites in the same
// order as those of the last such step Go ended in the same program generation: its checksum
// is that step's (the fold depends on the sites, the steered spans and their actions, all fixed
// by the generation), and its pin is released by zeroing the pin word, as Go's Snapshot.Close
// does. A native resolve of a new generation arms that end before any apply
// (capi_plan_expect_end): for the sites in the order of the last armed end (else the batch's
// sites in order), with the checksum Go computes for them (steer's PlainSum); so the first step
// of a new batch ends here too when its sites run in that order. Go ends the step for its own
// state (EndReleased: gates, counters, the snapshot forgotten) at its next call, after the
// trail.
//
// And the next steps of the same batch begin here (shmsteer_batch_resolve, capi_plan_resolve)
// while they are that step advanced by their first positions (the same ids, rows, phases and
// block rows) at the same region version, which a native resolve of Go armed (it stays armed
// through Go's end of that step, and any other call into Go disarms it): the checksum is the
// armed one, and the version is pinned here with pinCurrent's protocol on the armed step's
// reader slot (shm.Snapshot.PinWords): with the version word at the armed version, the slot's
// pin word goes from zero to it, and the pin holds if the horizon has not passed it; anything
// else (a write since, the slot busy, the horizon moved) goes to Go. A step begun and ended
// here is counted by Go at its next call (steer's Batch.CountSteps); one Go is called into
// while it is open is taken over (adopt in plan.go: Go pins the version itself before C's pin
// is released, resolves the same spans, and replays the step's applies). A steady decode batch
// then steps without entering the Go runtime, whose cold re-entry after a model's forward
// (sysmon woken from deep sleep, the runtime's lines) cost 25-50 µs a crossing.
//
// A device-path step (SHMSTEER_BATCH_END: resolved and ended in one call) is answered here
// too (capi_plan_device) when Go's last answer for the batch left the worker nothing to write
// (no table row, clamp record, gate or capture): the same batch advanced by its first positions
// at the same version (the current one, still the armed one; or the armed one named, not yet
// reclaimed) gets the same answer, whose buffers Go keeps pinned until its next resolve. Go
// counts those steps at its next call.
//
// Plans are indexed like the Go handle table (handles.go: slot index + 1 in the low 32 bits)
// and never freed: a stale or foreign handle reads a live plan whose handle differs. A stepper
// belongs to one thread at a time (shmsteer.h), so a plan has one user at a time.

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

typedef struct {
  uint64_t gen; // the program generation it was exported at (0: none)
  uint32_t lo, hi;
} capi_plan_site;

struct capi_plan {
  _Atomic uint64_t h; // the stepper's handle; 0: none
  int32_t open;
  int32_t d, layers, nsites;
  int64_t last_end; // the rows the batch's spans reach: a block needs at least these
  uint64_t gen;     // the program generation the open step runs
  capi_plan_site *sites;
  capi_plan_add *adds;
  uint32_t nadds, cap_adds;
  shmsteer_span *spans; // the resolved batch, as the caller passed it
  size_t nspans, cap_spans;
  char *ids; // its ids' bytes
  size_t cap_ids;
  uint32_t *trail; // sites applied here since Go last looked, in order
  uint32_t ntrail, cap_trail;
  // The end of a native step in C. fresh: no call into Go since the plan opened, so the trail
  // is every apply of the step. pin: the open step's pin word (its snapshot's reader slot in
  // the region's mapping), holding pin_ver; NULL unless a native resolve opened the plan. A
  // step of generation end_gen whose applies were end_trail ends with checksum end_sum (Go's
  // end of such a step armed it: end_ok). ended: C ended the step (stored zero in its pin
  // word); Go ends it at its next call (EndReleased).
  int32_t fresh, ended;
  _Atomic uint64_t *pin;
  uint64_t pin_ver;
  int32_t end_ok;
  uint32_t end_ntrail;
  uint64_t end_gen, end_sum;
  uint32_t *end_trail;
  uint32_t *arm_trail, arm_ntrail; // the step Go is ending, until capi_plan_end_sum installs it
  // The begin of a native step in C (capi_plan_resolve), armed by Go's native resolve
  // (capi_plan_arm_resolve): batch res_batch over res_rows rows, at version res_ver, checksum
  // res_sum, its spans p->spans but for their first positions; slot_pin a reader slot's pin
  // word, ver_word and horizon_word the region's (shm.Snapshot.PinWords).
  int32_t res_ok;
  uint64_t res_batch, res_ver, res_sum;
  int64_t res_rows;
  _Atomic uint64_t *slot_pin, *ver_word, *horizon_word;
  // Steps C began: copen, one is open (its applies from trail[cbase] on); csteps, steps it
  // began and ended (each with end_trail's applies) since Go last looked.
  int32_t copen;
  uint32_t cbase;
  uint64_t csteps;
  // A device-path step in C (capi_plan_resolve with SHMSTEER_BATCH_END), armed by Go's resolve
  // of batch dev_batch over dev_rows rows at version dev_ver that left nothing to do between
  // steps (no table row, clamp record, gate or capture: dev_info, its answer): while the spans
  // are dev_spans advanced by their first positions and the version word still reads dev_ver,
  // the answer is dev_info again. dsteps: such steps since Go last looked.
  int32_t dev_ok;
  uint64_t dev_batch, dev_ver, dsteps;
  int64_t dev_rows;
  _Atomic uint64_t *dev_ver_word, *dev_horizon_word;
  shmsteer_batch_info dev_info;
  shmsteer_span *dev_spans;
  size_t dev_nspans, dev_cap_spans;
  char *dev_ids;
  size_t dev_cap_ids;
  capi_plan_settled settled; // capi_plan_settle's answer, valid until the plan's next call
};

#define CAPI_PLANS 65536 /* handles.go's maxHandles */
static capi_plan *_Atomic capi_plans[CAPI_PLANS];
// The plan a batch's native resolve may begin in C, by the batch's handle (res_batch checks it).
static capi_plan *_Atomic capi_batch_plans[CAPI_PLANS];

static int capi_grow(void **buf, size_t *cap, size_t want, size_t elem) {
  if (want <= *cap) return 1;
  size_t n = *cap ? *cap : 8;
  while (n < want) n *= 2;
  void *b = realloc(*buf, n * elem);
  if (b == NULL) return 0;
  *buf = b;
  *cap = n;
  return 1;
}

capi_plan *capi_plan_register(uint64_t h, int32_t d, int32_t layers, int32_t nsites) {
  uint32_t i = (uint32_t)h - 1;
  if (i >= CAPI_PLANS || d <= 0 || layers <= 0 || nsites <= 0) return NULL;
  capi_plan *p = atomic_load_explicit(&capi_plans[i], memory_order_acquire);
  if (p == NULL) {
    p = calloc(1, sizeof *p);
    if (p == NULL) return NULL;
    atomic_store_explicit(&capi_plans[i], p, memory_order_release);
  }
  atomic_store_explicit(&p->h, 0, memory_order_release);
  p->open = 0;
  p->fresh = p->ended = p->end_ok = p->res_ok = p->copen = p->dev_ok = 0;
  p->csteps = p->dsteps = 0;
  p->pin = NULL;
  capi_plan_site *sites = realloc(p->sites, (size_t)nsites * sizeof *sites);
  uint32_t *trail = realloc(p->trail, (size_t)nsites * 2 * sizeof *trail);
  uint32_t *end_trail = realloc(p->end_trail, (size_t)nsites * 2 * sizeof *end_trail);
  uint32_t *arm_trail = realloc(p->arm_trail, (size_t)nsites * 2 * sizeof *arm_trail);
  if (sites) p->sites = sites;
  if (trail) p->trail = trail;
  if (end_trail) p->end_trail = end_trail;
  if (arm_trail) p->arm_trail = arm_trail;
  if (sites == NULL || trail == NULL || end_trail == NULL || arm_trail == NULL) return NULL;
  memset(p->sites, 0, (size_t)nsites * sizeof *sites);
  p->d = d;
  p->layers = layers;
  p->nsites = nsites;
  p->cap_trail = (uint32_t)nsites * 2;
  p->ntrail = 0;
  p->nadds = 0;
  p->gen = 0;
  atomic_store_explicit(&p->h, h, memory_order_release);
  return p;
}

void capi_plan_unregister(capi_plan *p) {
  if (p == NULL) return;
  p->open = 0;
  p->ntrail = 0;
  p->fresh = p->ended = p->end_ok = p->res_ok = p->copen = p->dev_ok = 0;
  p->csteps = p->dsteps = 0;
  p->pin = NULL;
  atomic_store_explicit(&p->h, 0, memory_order_release);
}

// capi_copy_spans copies n spans and their ids' bytes into *dst and *ids (grown as needed); 0
// when out of memory. *last gets the rows the spans reach.
static int capi_copy_spans(shmsteer_span **dst, size_t *cap, char **ids, size_t *cap_ids, const shmsteer_span *spans,
                           size_t n, int64_t *last) {
  size_t idn = 0;
  *last = 0;
  for (size_t i = 0; i < n; i++) {
    idn += spans[i].id_len;
    if (spans[i].end > *last) *last = spans[i].end;
  }
  if (!capi_grow((void **)dst, cap, n ? n : 1, sizeof **dst) || !capi_grow((void **)ids, cap_ids, idn ? idn : 1, 1))
    return 0;
  if (n) memcpy(*dst, spans, n * sizeof *spans);
  for (size_t i = 0, o = 0; i < n; i++) {
    if (spans[i].id_len) memcpy(*ids + o, spans[i].id, spans[i].id_len);
    o += spans[i].id_len;
  }
  return 1;
}

int capi_plan_open(capi_plan *p, uint64_t gen, const shmsteer_span *spans, size_t n) {
  p->open = 0;
  p->pin = NULL;
  int64_t last;
  if (!capi_copy_spans(&p->spans, &p->cap_spans, &p->ids, &p->cap_ids, spans, n, &last)) return 0;
  p->nspans = n;
  p->last_end = last;
  if (gen != p->gen) { // a new program: every site is Go's again until exported
    p->gen = gen;
    p->nadds = 0;
    memset(p->sites, 0, (size_t)p->nsites * sizeof *p->sites);
  }
  p->open = 1;
  p->fresh = 1;
  return 1;
}

void capi_plan_close(capi_plan *p) {
  p->open = 0;
  p->pin = NULL;
}

int capi_plan_is_open(const capi_plan *p) { return p->open; }

uint64_t capi_plan_gen(const capi_plan *p) { return p->gen; }

int capi_plan_spans_equal(const capi_plan *p, const shmsteer_span *spans, size_t n) {
  if (n != p->nspans) return 0;
  if (n == 0) return 1;
  if (spans == NULL || memcmp(spans, p->spans, n * sizeof *spans) != 0) return 0;
  // The same pointers: the bytes behind them may still have changed.
  for (size_t i = 0, o = 0; i < n; i++) {
    size_t l = spans[i].id_len;
    if (l && memcmp(spans[i].id, p->ids + o, l) != 0) return 0;
    o += l;
  }
  return 1;
}

capi_plan_add *capi_plan_site_reserve(capi_plan *p, uint32_t n) {
  size_t cap = p->cap_adds;
  if ((uint64_t)p->nadds + n > UINT32_MAX / 2 ||
      !capi_grow((void **)&p->adds, &cap, (size_t)p->nadds + (n ? n : 1), sizeof *p->adds))
    return NULL;
  p->cap_adds = (uint32_t)cap;
  return p->adds + p->nadds;
}

void capi_plan_site_commit(capi_plan *p, uint32_t site, uint32_t n) {
  if (site >= (uint32_t)p->nsites) return;
  capi_plan_site *s = &p->sites[site];
  s->lo = p->nadds;
  s->hi = p->nadds + n;
  s->gen = p->gen;
  p->nadds += n;
}

int capi_plan_site_ready(const capi_plan *p, uint32_t site) {
  return site < (uint32_t)p->nsites && p->gen != 0 && p->sites[site].gen == p->gen;
}

void capi_plan_set_pin(capi_plan *p, uint64_t *pin, uint64_t ver) {
  if (!p->open) return;
  p->pin = (_Atomic uint64_t *)pin;
  p->pin_ver = ver;
}

int capi_plan_arm_end(capi_plan *p) {
  // A step C did not see whole leaves the armed end as it was: still right for its sites.
  uint32_t base = p->copen ? p->cbase : 0; // a step C began: its applies follow the last step's
  if (!p->open || !p->fresh || p->pin == NULL || p->gen == 0 || p->ntrail <= base) return 0;
  // Staged: the armed end stays as it is while Go counts the steps C ended with it.
  memcpy(p->arm_trail, p->trail + base, (p->ntrail - base) * sizeof *p->trail);
  p->arm_ntrail = p->ntrail - base;
  return 1;
}

void capi_plan_end_sum(capi_plan *p, uint64_t sum) {
  memcpy(p->end_trail, p->arm_trail, p->arm_ntrail * sizeof *p->trail);
  p->end_ntrail = p->arm_ntrail;
  p->end_gen = p->gen;
  p->end_sum = sum;
  p->end_ok = 1;
}

// capi_plan_end_order: the sites, in order, of the steps C may end now (the last armed end's,
// of any generation; 0 when none was armed): Go's guess of the order a new program's sites run.
// UINT32_MAX when the end is armed for the open plan's generation already (nothing to guess).
uint32_t capi_plan_end_order(const capi_plan *p, const uint32_t **sites) {
  *sites = p->end_trail;
  if (p->end_ok && p->end_gen == p->gen) return UINT32_MAX;
  return p->end_ok ? p->end_ntrail : 0;
}

// capi_plan_expect_end arms the end of the native step Go's resolve just opened before any of
// its applies (capi_plan_end): when they are sites (n of them, in order) its checksum is sum,
// which Go computed for them (steer's PlainSum). An end armed for this generation already
// stays (Go armed it from a step it ended). sites may be end_trail itself.
void capi_plan_expect_end(capi_plan *p, const uint32_t *sites, uint32_t n, uint64_t sum) {
  if (!p->open || !p->fresh || p->pin == NULL || p->gen == 0 || n == 0 || n > (uint32_t)p->nsites * 2) return;
  if (p->end_ok && p->end_gen == p->gen) return;
  memmove(p->end_trail, sites, n * sizeof *sites);
  p->end_ntrail = n;
  p->end_gen = p->gen;
  p->end_sum = sum;
  p->end_ok = 1;
}

int capi_plan_end(uint64_t h, uint64_t *checksum) {
  uint32_t i = (uint32_t)h - 1;
  if (i >= CAPI_PLANS) return 0;
  capi_plan *p = atomic_load_explicit(&capi_plans[i], memory_order_acquire);
  if (p == NULL || atomic_load_explicit(&p->h, memory_order_acquire) != h || !p->open || !p->fresh ||
      p->pin == NULL || !p->end_ok || p->end_gen != p->gen)
    return 0;
  uint32_t base = p->copen ? p->cbase : 0; // a step C began: its applies follow the last step's
  if (p->ntrail - base != p->end_ntrail ||
      memcmp(p->trail + base, p->end_trail, p->end_ntrail * sizeof *p->trail) != 0)
    return 0;
  if (atomic_load_explicit(p->pin, memory_order_relaxed) != p->pin_ver) return 0;
  // What Go's Snapshot.Close does: zero the slot's pin word (the owner's reclamation scans it).
  atomic_store_explicit(p->pin, 0, memory_order_release);
  p->open = 0;
  p->pin = NULL;
  if (p->copen) { // Go never saw it: it counts it (Batch.CountSteps), the applies with it
    p->copen = 0;
    p->ntrail = base;
    p->csteps++;
  } else {
    p->ended = 1;
  }
  if (checksum) *checksum = p->end_sum;
  return 1;
}

void capi_plan_arm_resolve(capi_plan *p, uint64_t batch, int64_t rows, uint64_t ver, uint64_t sum,
                           uint64_t *ver_word, uint64_t *horizon_word) {
  p->res_ok = 0;
  uint32_t i = (uint32_t)batch - 1;
  if (!p->open || p->pin == NULL || i >= CAPI_PLANS || ver == 0) return;
  p->res_batch = batch;
  p->res_rows = rows;
  p->res_ver = ver;
  p->res_sum = sum;
  p->slot_pin = p->pin;
  p->ver_word = (_Atomic uint64_t *)ver_word;
  p->horizon_word = (_Atomic uint64_t *)horizon_word;
  p->res_ok = 1;
  atomic_store_explicit(&capi_batch_plans[i], p, memory_order_release);
}

void capi_plan_disarm(capi_plan *p, int all) {
  p->res_ok = 0;
  p->dev_ok = 0;
  if (!all) return;
  p->end_ok = 0; // the region goes: nothing of its mapping is touched from here on
  p->open = 0;
  p->pin = NULL;
}

int capi_plan_res_ok(const capi_plan *p) { return p->res_ok; }

void capi_plan_rearm(capi_plan *p) { p->res_ok = p->res_batch != 0 && p->res_ver != 0; }

const capi_plan_settled *capi_plan_settle(capi_plan *p, int keep) {
  capi_plan_settled *s = &p->settled;
  if (!keep) { // any call but an apply: C begins no step until a native resolve arms it again
    capi_plan_close(p);
    capi_plan_disarm(p, 0);
  }
  s->cbase = p->copen ? p->cbase : UINT32_MAX;
  s->trail = p->trail;
  s->ntrail = p->ntrail;
  p->ntrail = 0;
  p->fresh = 0; // Go is in: what the step does from here on, C no longer sees whole
  s->ended = p->ended;
  p->ended = 0;
  s->csteps = p->csteps;
  p->csteps = 0;
  s->csites = p->end_trail;
  s->ncsites = p->end_ntrail;
  s->dsteps = p->dsteps;
  p->dsteps = 0;
  s->dbatch = p->dev_batch;
  return s;
}

const shmsteer_span *capi_plan_step(const capi_plan *p, size_t *n, const char **ids, uint64_t *batch, int64_t *rows,
                                    uint64_t *ver) {
  *n = p->nspans;
  *ids = p->ids;
  *batch = p->res_batch;
  *rows = p->res_rows;
  *ver = p->res_ver;
  return p->spans;
}

void capi_plan_adopted(capi_plan *p) {
  if (!p->copen) return;
  if (p->slot_pin != NULL) atomic_store_explicit(p->slot_pin, 0, memory_order_release);
  p->copen = 0;
  p->pin = NULL;
}

// capi_spans_advanced: spans are the plan's but for their first positions (the same ids, rows
// and phases: a decode batch one token on).
static int capi_spans_advanced(const shmsteer_span *had, size_t nhad, const char *ids, const shmsteer_span *spans,
                               size_t n) {
  if (n != nhad || (n > 0 && spans == NULL)) return 0;
  for (size_t i = 0, o = 0; i < n; i++) {
    const shmsteer_span *a = &spans[i], *b = &had[i];
    if (a->id_len != b->id_len || a->start != b->start || a->end != b->end || a->phase != b->phase ||
        a->first_position < 0 || (a->id_len && memcmp(a->id, ids + o, a->id_len) != 0))
      return 0;
    o += a->id_len;
  }
  return 1;
}

void capi_plan_arm_device(capi_plan *p, uint64_t batch, int64_t rows, uint64_t ver, uint64_t *ver_word,
                          uint64_t *horizon_word, const shmsteer_span *spans, size_t n, const shmsteer_batch_info *info) {
  p->dev_ok = 0;
  uint32_t i = (uint32_t)batch - 1;
  int64_t last;
  if (i >= CAPI_PLANS || ver == 0 || ver_word == NULL || horizon_word == NULL ||
      !capi_copy_spans(&p->dev_spans, &p->dev_cap_spans, &p->dev_ids, &p->dev_cap_ids, spans, n, &last))
    return;
  p->dev_nspans = n;
  p->dev_batch = batch;
  p->dev_rows = rows;
  p->dev_ver = ver;
  p->dev_ver_word = (_Atomic uint64_t *)ver_word;
  p->dev_horizon_word = (_Atomic uint64_t *)horizon_word;
  p->dev_info = *info;
  p->dev_ok = 1;
  atomic_store_explicit(&capi_batch_plans[i], p, memory_order_release);
}

// capi_plan_device is capi_plan_resolve for a device-path step (SHMSTEER_BATCH_END) at version
// (0: the current one, which must still be the armed one; else the armed one, not reclaimed,
// as Go's SnapshotAt requires): no pin is taken (the step ends in the call, as Go's does); the
// answer's buffers are the Go batch's, pinned until its next resolve in Go.
static int capi_plan_device(capi_plan *p, uint64_t bh, uint64_t version, const shmsteer_span *spans, size_t n,
                            int64_t rows, shmsteer_batch_info *out) {
  if (!p->dev_ok || p->dev_batch != bh || p->open || p->copen || rows != p->dev_rows ||
      !capi_spans_advanced(p->dev_spans, p->dev_nspans, p->dev_ids, spans, n))
    return 0;
  if (version == 0 ? atomic_load_explicit(p->dev_ver_word, memory_order_acquire) != p->dev_ver
                   : version != p->dev_ver || atomic_load(p->dev_horizon_word) > version)
    return 0;
  *out = p->dev_info;
  p->dsteps++;
  return 1;
}

int capi_plan_resolve(uint64_t bh, uint64_t version, const shmsteer_span *spans, size_t n, int64_t rows, uint32_t flags,
                      shmsteer_batch_info *out) {
  uint32_t i = (uint32_t)bh - 1;
  if (out == NULL || i >= CAPI_PLANS) return 0;
  capi_plan *p = atomic_load_explicit(&capi_batch_plans[i], memory_order_acquire);
  if (p == NULL || atomic_load_explicit(&p->h, memory_order_acquire) == 0) return 0;
  if (flags == SHMSTEER_BATCH_END) return capi_plan_device(p, bh, version, spans, n, rows, out);
  if (flags != SHMSTEER_BATCH_NATIVE || version != 0 || !p->res_ok || p->res_batch != bh || p->open || p->copen ||
      rows != p->res_rows || p->ntrail > p->cap_trail / 2 || !capi_spans_advanced(p->spans, p->nspans, p->ids, spans, n))
    return 0;
  // pinCurrent's protocol on the armed slot, at the armed version only (a write since: Go).
  uint64_t v = atomic_load_explicit(p->ver_word, memory_order_acquire), zero = 0;
  if (v != p->res_ver || !atomic_compare_exchange_strong(p->slot_pin, &zero, v)) return 0;
  if (atomic_load(p->horizon_word) > v) {
    atomic_store_explicit(p->slot_pin, 0, memory_order_release);
    return 0;
  }
  if (n) memcpy(p->spans, spans, n * sizeof *spans);
  p->open = 1;
  p->fresh = 1;
  p->pin = p->slot_pin;
  p->pin_ver = v;
  p->copen = 1;
  p->cbase = p->ntrail;
  memset(out, 0, sizeof *out);
  out->version = v;
  out->checksum = p->res_sum;
  return 1;
}

// The adds, in float32 and in bfloat16 (widened, added in float32, narrowed to nearest even;
// an element whose sum is its old value widened keeps its bytes, a NaN stays a NaN, as
// kernels.F32ToBF16). Elementwise, so any vector width gives the same bits.

#pragma GCC push_options
#pragma GCC optimize("O3")

__attribute__((target_clones("avx512f", "avx2", "default"))) static void capi_add_f32(float *restrict h,
                                                                                     const float *restrict v,
                                                                                     const float *restrict g,
                                                                                     size_t n) {
  if (g) {
    for (size_t j = 0; j < n; j++) h[j] += v[j] + g[j];
  } else {
    for (size_t j = 0; j < n; j++) h[j] += v[j];
  }
}

static inline uint16_t capi_bf16_narrow(float f, uint16_t old) {
  uint32_t b;
  memcpy(&b, &f, 4);
  uint16_t r = (b & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((b >> 16) | 0x40) : (uint16_t)((b + 0x7fffu + ((b >> 16) & 1)) >> 16);
  return b == (uint32_t)old << 16 ? old : r;
}

__attribute__((target_clones("avx512f", "avx2", "default"))) static void capi_add_bf16(uint16_t *restrict h,
                                                                                      const float *restrict v,
                                                                                      const float *restrict g,
                                                                                      size_t n) {
  for (size_t j = 0; j < n; j++) {
    uint32_t w = (uint32_t)h[j] << 16;
    float f;
    memcpy(&f, &w, 4);
    f += g ? v[j] + g[j] : v[j];
    h[j] = capi_bf16_narrow(f, h[j]);
  }
}

#pragma GCC pop_options

static void capi_run_adds(const capi_plan *p, const capi_plan_site *s, void *rows, int bf16) {
  size_t d = (size_t)p->d;
  for (uint32_t i = s->lo; i < s->hi; i++) {
    const capi_plan_add *a = &p->adds[i];
    for (int64_t r = a->start; r < a->end; r++) {
      const float *v = a->kind == CAPI_ADD_BLOCK ? a->v + (size_t)(r - a->start) * d : a->v;
      const float *g = a->kind == CAPI_ADD_PAIR ? a->g : NULL;
      if (bf16)
        capi_add_bf16((uint16_t *)rows + (size_t)r * d, v, g, d);
      else
        capi_add_f32((float *)rows + (size_t)r * d, v, g, d);
    }
  }
}

int capi_plan_apply(uint64_t h, uint32_t hook, int32_t layer, void *rows, size_t n, int bf16,
                    const shmsteer_span *spans, size_t n_spans) {
  uint32_t i = (uint32_t)h - 1;
  if (i >= CAPI_PLANS) return 0;
  capi_plan *p = atomic_load_explicit(&capi_plans[i], memory_order_acquire);
  if (p == NULL || atomic_load_explicit(&p->h, memory_order_acquire) != h || !p->open) return 0;
  if (layer < 0 || layer >= p->layers || hook >= (uint32_t)(p->nsites / p->layers)) return 0;
  uint32_t site = hook * (uint32_t)p->layers + (uint32_t)layer;
  const capi_plan_site *s = &p->sites[site];
  size_t d = (size_t)p->d;
  if (s->gen != p->gen || p->gen == 0 || p->ntrail >= p->cap_trail || n % d != 0 || n / d < (uint64_t)p->last_end ||
      (rows == NULL && n > 0) || !capi_plan_spans_equal(p, spans, n_spans))
    return 0;
  capi_run_adds(p, s, rows, bf16);
  p->trail[p->ntrail++] = site;
  return 1;
}
