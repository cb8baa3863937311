// Exercises shmsteer_request_admit_binary (TestAdmitBinary): an owner in this process admits the
// same override as JSON float lists and as float32 buffers and prints both entries' digests;
// then every bad input, each printed with its error's name and whether the region changed; then
// a hook id beyond 16 bits at register and apply: refused, not taken for its low bits' hook.

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

static void hex(const char *what, const uint8_t *d) {
  printf("%s ", what);
  for (int i = 0; i < 32; i++) printf("%02x", d[i]);
  printf("\n");
}

// One refused admission: its error's name, and "unchanged" when the region's version held.
static void refused(const char *what, const char *json, const shmsteer_admit_vector *v, size_t n) {
  uint64_t before = version();
  shmsteer_admitted out;
  int rc = shmsteer_request_admit_binary(owner, "bad", 3, json, json ? strlen(json) : 0, v, n, &out);
  printf("%s: %s %s\n", what, shmsteer_error_name(rc), version() == before ? "unchanged" : "CHANGED");
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  shmsteer_owner_config cfg = {.hidden = HIDDEN, .layers = LAYERS, .arena_bytes = 8 << 20};
  int rc = shmsteer_owner_start(argv[1], "admit-binary", 12, NULL, &cfg, &owner);
  if (rc != SHMSTEER_OK) {
    printf("owner: %s %s\n", shmsteer_error_name(rc), shmsteer_last_error());
    return 1;
  }
  float a[HIDDEN], b[HIDDEN];
  for (int i = 0; i < HIDDEN; i++) {
    a[i] = 0.1f * (float)(i + 1);
    b[i] = -0.37f * (float)i + 0.001f;
  }
  // The same override twice: prefill (post_block, 0) a at scale 2 and decode (mlp_in, 1) b, plus
  // a clamp given in the JSON of both.
  char js[4096];
  int n = snprintf(js, sizeof js, "{\"conversation\": \"c\", \"override\": {\"prefill\": {\"vectors\": [{\"hook\": \"post_block\", \"layer\": 0, \"scale\": 2, \"data\": [");
  for (int i = 0; i < HIDDEN; i++) n += snprintf(js + n, sizeof js - n, "%s%.9g", i ? ", " : "", a[i]);
  n += snprintf(js + n, sizeof js - n, "]}]}, \"decode\": {\"vectors\": [{\"hook\": \"mlp_in\", \"layer\": 1, \"scale\": 1, \"data\": [");
  for (int i = 0; i < HIDDEN; i++) n += snprintf(js + n, sizeof js - n, "%s%.9g", i ? ", " : "", b[i]);
  snprintf(js + n, sizeof js - n, "]}], \"clamps\": [{\"hook\": \"pre_attn\", \"layer\": 0, \"dir\": [1, 0, 0, 0, 0, 0, 0, 0], \"min\": -1, \"max\": 1, \"strength\": 1}]}}}");
  shmsteer_admitted viajson, viabin;
  rc = shmsteer_request_admit_result(owner, "r-json", 6, js, strlen(js), &viajson);
  printf("json: %s source=%d\n", shmsteer_error_name(rc), viajson.source);
  const char *rest = "{\"conversation\": \"c2\", \"override\": {\"decode\": {\"clamps\": [{\"hook\": \"pre_attn\", \"layer\": 0, "
                     "\"dir\": [1, 0, 0, 0, 0, 0, 0, 0], \"min\": -1, \"max\": 1, \"strength\": 1}]}}}";
  uint32_t post_block = 2, mlp_in = 3;
  shmsteer_admit_vector vs[2] = {
      {.tier = SHMSTEER_TIER_PREFILL, .hook = post_block, .layer = 0, .scale = 2, .data = a, .len = HIDDEN},
      {.tier = SHMSTEER_TIER_DECODE, .hook = mlp_in, .layer = 1, .scale = 1, .data = b, .len = HIDDEN},
  };
  rc = shmsteer_request_admit_binary(owner, "r-bin", 5, rest, strlen(rest), vs, 2, &viabin);
  printf("binary: %s source=%d latched=%d\n", shmsteer_error_name(rc), viabin.source, viabin.latched);
  hex("json digest", viajson.digest);
  hex("binary digest", viabin.digest);
  printf("digests %s\n", memcmp(viajson.digest, viabin.digest, 32) == 0 ? "equal" : "DIFFER");
  // No JSON at all: an override is made for the vectors.
  rc = shmsteer_request_admit_binary(owner, "r-bare", 6, NULL, 0, vs + 1, 1, &viabin);
  printf("bare: %s source=%d\n", shmsteer_error_name(rc), viabin.source);

  shmsteer_admit_vector bad = vs[1];
  refused("null vectors", NULL, NULL, 1);
  bad.data = NULL;
  refused("null data", NULL, &bad, 1);
  bad = vs[1], bad.tier = 3;
  refused("tier 3", NULL, &bad, 1);
  bad = vs[1], bad.hook = 5;
  refused("hook 5", NULL, &bad, 1);
  bad = vs[1], bad.hook = 65536 + 2;
  refused("hook 65538", NULL, &bad, 1);
  bad = vs[1], bad.len = HIDDEN - 1;
  refused("short", NULL, &bad, 1);
  bad = vs[1], bad.len = (size_t)1 << 62;
  refused("huge len", NULL, &bad, 1);
  bad = vs[1], bad.layer = LAYERS;
  refused("layer 2", NULL, &bad, 1);
  bad = vs[1], bad.layer = -1;
  refused("layer -1", NULL, &bad, 1);
  float nan[HIDDEN] = {0};
  nan[3] = NAN;
  bad = vs[1], bad.data = nan;
  refused("nan", NULL, &bad, 1);
  bad = vs[1], bad.scale = INFINITY;
  refused("inf scale", NULL, &bad, 1);
  bad = vs[1], bad.scale = 1e30f;
  refused("overflow", NULL, &bad, 1);
  shmsteer_admit_vector twice[2] = {vs[1], vs[1]};
  refused("duplicate", NULL, twice, 2);
  refused("duplicate of json", js, vs, 1);
  refused("bad json", "{\"override\": 1}", vs, 1);
  uint64_t before = version();
  shmsteer_vector_entry e = {.hook = 65536 + post_block, .layer = 0, .scale = 1, .data = a, .len = HIDDEN};
  rc = shmsteer_vector_register(owner, "v", 1, &e, 1, NULL);
  printf("register hook 65538: %s %s\n", shmsteer_error_name(rc), version() == before ? "unchanged" : "CHANGED");
  shmsteer_stepper_t *st = NULL;
  rc = shmsteer_stepper_new(owner, &st);
  if (rc == SHMSTEER_OK) rc = shmsteer_stepper_begin(st, 0, NULL);
  float rows[HIDDEN] = {0};
  shmsteer_span span = {.id = "r-bare", .id_len = 6, .start = 0, .end = 1, .phase = SHMSTEER_PHASE_DECODE};
  if (rc == SHMSTEER_OK) rc = shmsteer_stepper_apply(st, 65536 + mlp_in, 1, rows, HIDDEN, &span, 1);
  printf("apply hook 65539: %s rows %s\n", shmsteer_error_name(rc), rows[1] == 0 ? "untouched" : "WRITTEN");
  rc = shmsteer_stepper_apply(st, mlp_in, 1, rows, HIDDEN, &span, 1);
  printf("apply hook 3: %s rows %s\n", shmsteer_error_name(rc), rows[1] == b[1] ? "steered" : "NOT STEERED");
  shmsteer_stepper_end(st, NULL);
  shmsteer_stepper_free(st);
  printf("closed: %s\n", shmsteer_error_name(shmsteer_close(owner)));
  return 0;
}
