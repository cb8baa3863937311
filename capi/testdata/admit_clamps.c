// Exercises shmsteer_request_admit_buffers (TestAdmitBuffersClamps): an owner in this process
// admits the same override's clamps as JSON float lists and by address and prints whether the
// two entries' digests are equal; then every bad clamp, each printed with its error's name and
// whether the region changed.

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "shmsteer.h"

#define HIDDEN 8
#define LAYERS 2

static shmsteer_t *owner;

static uint64_t version(void) {
  uint64_t v = 0;
  shmsteer_version(owner, &v);
  return v;
}

// One refused admission: its error's name, and "unchanged" when the region's version held.
static void refused(const char *what, const shmsteer_admit_clamp *c, size_t n) {
  uint64_t before = version();
  shmsteer_admitted out;
  int rc = shmsteer_request_admit_buffers(owner, "bad", 3, NULL, 0, NULL, 0, c, n, &out);
  printf("%s: %s %s\n", what, shmsteer_error_name(rc), version() == before ? "unchanged" : "CHANGED");
}

static int list(char *s, size_t size, const float *d) {
  int n = 0;
  for (int i = 0; i < HIDDEN; i++) n += snprintf(s + n, size - n, "%s%.9g", i ? ", " : "", d[i]);
  return n;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  shmsteer_owner_config cfg = {.hidden = HIDDEN, .layers = LAYERS, .arena_bytes = 8 << 20};
  int rc = shmsteer_owner_start(argv[1], "admit-clamps", 12, NULL, &cfg, &owner);
  if (rc != SHMSTEER_OK) {
    printf("owner: %s %s\n", shmsteer_error_name(rc), shmsteer_last_error());
    return 1;
  }
  float a[HIDDEN], b[HIDDEN], c[HIDDEN];
  for (int i = 0; i < HIDDEN; i++) {
    a[i] = 0.1f * (float)(i + 1);
    b[i] = -0.37f * (float)i + 0.001f;
    c[i] = i == 3 ? 1.0f : 0.0f;
  }
  uint32_t post_block = 2, mlp_in = 3;
  // Base: one clamp at (post_block, 0); decode: two at (mlp_in, 1), applied in order.
  shmsteer_admit_clamp cs[3] = {
      {.tier = SHMSTEER_TIER_BASE, .hook = post_block, .layer = 0, .min = -1, .max = 1, .strength = 1, .dir = a, .len = HIDDEN},
      {.tier = SHMSTEER_TIER_DECODE, .hook = mlp_in, .layer = 1, .min = 0.5f, .max = 0.5f, .strength = 0.25f, .dir = b, .len = HIDDEN},
      {.tier = SHMSTEER_TIER_DECODE, .hook = mlp_in, .layer = 1, .min = -2, .max = 3, .strength = 1, .dir = c, .len = HIDDEN},
  };
  char js[8192];
  int n = snprintf(js, sizeof js, "{\"conversation\": \"c\", \"override\": {\"base\": {\"refs\": [], \"clamps\": [{\"hook\": \"post_block\", \"layer\": 0, \"min\": -1, \"max\": 1, \"strength\": 1, \"dir\": [");
  n += list(js + n, sizeof js - n, a);
  n += snprintf(js + n, sizeof js - n, "]}]}, \"decode\": {\"clamps\": [{\"hook\": \"mlp_in\", \"layer\": 1, \"min\": 0.5, \"max\": 0.5, \"strength\": 0.25, \"dir\": [");
  n += list(js + n, sizeof js - n, b);
  n += snprintf(js + n, sizeof js - n, "]}, {\"hook\": \"mlp_in\", \"layer\": 1, \"min\": -2, \"max\": 3, \"strength\": 1, \"dir\": [");
  n += list(js + n, sizeof js - n, c);
  snprintf(js + n, sizeof js - n, "]}]}}}");
  shmsteer_admitted viajson, viabuf, swapped;
  rc = shmsteer_request_admit_result(owner, "r-json", 6, js, strlen(js), &viajson);
  printf("json: %s source=%d\n", shmsteer_error_name(rc), viajson.source);
  const char *rest = "{\"conversation\": \"c2\", \"override\": {\"base\": {\"refs\": []}}}";
  rc = shmsteer_request_admit_buffers(owner, "r-buf", 5, rest, strlen(rest), NULL, 0, cs, 3, &viabuf);
  printf("buffers: %s source=%d latched=%d\n", shmsteer_error_name(rc), viabuf.source, viabuf.latched);
  printf("digests %s\n", memcmp(viajson.digest, viabuf.digest, 32) == 0 ? "equal" : "DIFFER");
  // The decode tier's two clamps in the other order: another entry.
  shmsteer_admit_clamp other[3] = {cs[0], cs[2], cs[1]};
  rc = shmsteer_request_admit_buffers(owner, "r-swap", 6, rest, strlen(rest), NULL, 0, other, 3, &swapped);
  printf("swapped: %s digests %s\n", shmsteer_error_name(rc), memcmp(viabuf.digest, swapped.digest, 32) == 0 ? "EQUAL" : "differ");
  // With vectors by address too, and no JSON at all.
  shmsteer_admit_vector v = {.tier = SHMSTEER_TIER_PREFILL, .hook = post_block, .layer = 1, .scale = 1, .data = b, .len = HIDDEN};
  rc = shmsteer_request_admit_buffers(owner, "r-both", 6, NULL, 0, &v, 1, cs, 1, &viabuf);
  printf("both: %s source=%d\n", shmsteer_error_name(rc), viabuf.source);

  shmsteer_admit_clamp bad;
  refused("null clamps", NULL, 1);
  bad = cs[0], bad.dir = NULL;
  refused("null dir", &bad, 1);
  bad = cs[0], bad.tier = 3;
  refused("tier 3", &bad, 1);
  bad = cs[0], bad.hook = 5;
  refused("hook 5", &bad, 1);
  bad = cs[0], bad.hook = 65536 + 2;
  refused("hook 65538", &bad, 1);
  bad = cs[0], bad.len = HIDDEN - 1;
  refused("short", &bad, 1);
  bad = cs[0], bad.len = (size_t)1 << 62;
  refused("huge len", &bad, 1);
  bad = cs[0], bad.layer = LAYERS;
  refused("layer 2", &bad, 1);
  float nan[HIDDEN] = {0};
  nan[3] = NAN;
  bad = cs[0], bad.dir = nan;
  refused("nan dir", &bad, 1);
  bad = cs[0], bad.min = -INFINITY;
  refused("inf min", &bad, 1);
  bad = cs[0], bad.min = 2;
  refused("min > max", &bad, 1);
  float zero[HIDDEN] = {0};
  bad = cs[0], bad.dir = zero;
  refused("zero dir", &bad, 1);
  bad = cs[0], bad.strength = 2;
  refused("strength 2", &bad, 1);
  bad = cs[0], bad.strength = -0.5f;
  refused("strength -0.5", &bad, 1);
  printf("closed: %s\n", shmsteer_error_name(shmsteer_close(owner)));
  return 0;
}
