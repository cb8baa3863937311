//go:build cgo

// The key get that does not enter the Go runtime: shmsteer_reader_key_get and
// shmsteer_reader_key_get_tls first ask the C reader (shmread_gen.h: shm's reader translated
// to C from internal/shmlayout's one source), through the shm.Reader's descriptor that the Go side
// registered here when it opened the reader (keys_fast.go). Whatever the C reader does not
// answer (a miss, a revoked key, a buffer too small, a closed reader, ...) goes to the Go
// reader, which answers it as before.

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "shmread_gen.h"
#include "shmsteer.h"

// One registered reader: its handle (0: none) and its descriptor. Slots are indexed like the
// Go handle table (handles.go: slot index + 1 in the low 32 bits); an entry is never freed, so
// a stale or foreign handle reads a live entry whose handle differs, never freed memory.
typedef struct {
  _Atomic uint64_t h;
  const void *desc;
  uint16_t kind;
  unsigned char live;
} capi_fast_reader;

#define CAPI_FAST_READERS 65536 /* handles.go's maxHandles */
static capi_fast_reader capi_fast_readers[CAPI_FAST_READERS];

void capi_fast_register(uint64_t h, uintptr_t desc, uint16_t kind, unsigned char live) {
  uint32_t i = (uint32_t)h - 1;
  if (i >= CAPI_FAST_READERS || desc == 0) return;
  capi_fast_reader *e = &capi_fast_readers[i];
  atomic_store_explicit(&e->h, 0, memory_order_release);
  e->desc = (const void *)desc;
  e->kind = kind;
  e->live = live;
  atomic_store_explicit(&e->h, h, memory_order_release);
}

void capi_fast_unregister(uint64_t h) {
  uint32_t i = (uint32_t)h - 1;
  if (i >= CAPI_FAST_READERS) return;
  uint64_t want = h;
  atomic_compare_exchange_strong_explicit(&capi_fast_readers[i].h, &want, 0, memory_order_acq_rel,
                                          memory_order_relaxed);
}

// capi_fast_known reports whether h is a registered reader handle now.
int capi_fast_known(uint64_t h) {
  uint32_t i = (uint32_t)h - 1;
  return i < CAPI_FAST_READERS && atomic_load_explicit(&capi_fast_readers[i].h, memory_order_acquire) == h;
}

// capi_fast_get answers a key get through reader handle h: 1 with the key copied into buf and
// *len set, or 0 when the Go reader must answer (nothing was written to buf or *len).
int capi_fast_get(uint64_t h, const char *id, size_t id_len, void *buf, size_t cap, size_t *len) {
  uint32_t i = (uint32_t)h - 1;
  if (i >= CAPI_FAST_READERS || id == NULL || len == NULL) return 0;
  capi_fast_reader *e = &capi_fast_readers[i];
  if (atomic_load_explicit(&e->h, memory_order_acquire) != h) return 0;
  const void *d = e->desc;
  const unsigned char *val;
  uint64_t vl;
  if (!shm_fast_find(d, e->kind, (const unsigned char *)id, id_len, &val, &vl)) return 0;
  // A registry entry: the key, then its state byte.
  int ok = vl > 0 && val[vl - 1] == e->live && vl - 1 <= cap && (buf != NULL || vl == 1);
  if (ok) {
    if (vl > 1) memcpy(buf, val, vl - 1);
    *len = vl - 1;
  }
  shm_fast_unpin(d);
  return ok;
}

// capi_fast_find_desc runs the C reader on a descriptor directly, for capi's tests and its fuzz
// target: 1 with the value's offset from the arena's start and its length (the pin released),
// or 0.
int capi_fast_find_desc(uintptr_t desc, uint16_t kind, const void *key, size_t klen, uint64_t *off, uint64_t *vlen) {
  const void *d = (const void *)desc;
  const unsigned char *val;
  if (!shm_fast_find(d, kind, (const unsigned char *)key, klen, &val, vlen)) return 0;
  *off = (uint64_t)(val - (const unsigned char *)(uintptr_t)SHM_DW(d, SHM_D_ARENA));
  shm_fast_unpin(d);
  return 1;
}

// capi_fast_hash is the C reader's index hash of (kind, key) with a descriptor's salt, as
// shm_getAt computes it, for the fuzz targets (which aim index words at the blobs they forge,
// and compare it with the reference).
uint64_t capi_fast_hash(uintptr_t desc, uint16_t kind, const void *key, size_t klen) {
  const void *d = (const void *)desc;
  if (kind < SHM_SEEDED_KINDS)
    return shm_keyHashFrom(SHM_DW(d, SHM_D_SEEDS + 8 * (uint64_t)kind), SHM_DW(d, SHM_D_HASH_K1), SHM_DW(d, SHM_D_HASH_K2),
                           (const unsigned char *)key, klen);
  return shm_keyHash(SHM_DW(d, SHM_D_HASH_K0), SHM_DW(d, SHM_D_HASH_K1), kind, (const unsigned char *)key, klen);
}
