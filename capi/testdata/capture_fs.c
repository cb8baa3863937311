// Exercises shmsteer_capture_serve's declarations and the in-process filesystem consumer
// (TestCaptureServeAndFS): each bad declaration printed with its error's name and whether the
// owner still serves no capture (an admission naming the consumer is still refused, the region
// version held); then a good one; then the consumer's refusals, a captured request written by
// shmsteer_capture_fs_start's consumer, its published paths, and the stop's counters.

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shmsteer.h"

#define HIDDEN 8
#define LAYERS 2
#define SECRET "capture-fs", 10

static shmsteer_t *owner;
static const char *ns;
static const char *capjs = "{\"capture\": {\"fs\": {\"request_id\": \"r1\", \"tag\": \"t\", \"hooks\": {\"post_block\": [1]}, "
                           "\"positions\": \"all\"}}, \"prompt_len\": 3}";

static uint64_t version(void) {
  uint64_t v = 0;
  shmsteer_version(owner, &v);
  return v;
}

// A refused declaration: its error's name, and "unchanged" when the owner still refuses a
// capture admission for lack of the consumer and the region's version held.
static void refused_decl(const char *what, const char *decl) {
  uint64_t before = version();
  int rc = shmsteer_capture_serve(owner, decl);
  uint64_t after = version();
  int adm = shmsteer_request_admit_json(owner, "probe", 5, capjs, strlen(capjs), NULL);
  printf("%s: %s %s\n", what, shmsteer_error_name(rc),
         after == before && adm == SHMSTEER_E_CAPTURE_CONSUMER ? "unchanged" : "CHANGED");
}

static void refused_fs(const char *what, shmsteer_capture_fs_options *opt) {
  shmsteer_capture_fs_t *fs = NULL;
  int rc = shmsteer_capture_fs_start(ns, SECRET, NULL, opt, &fs);
  printf("%s: %s%s\n", what, shmsteer_error_name(rc), fs == NULL ? "" : " HANDLE");
}

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  ns = argv[1];
  const char *root = argv[2];
  shmsteer_owner_config cfg = {.hidden = HIDDEN, .layers = LAYERS, .arena_bytes = 8 << 20};
  int rc = shmsteer_owner_start(ns, SECRET, NULL, &cfg, &owner);
  if (rc != SHMSTEER_OK) {
    printf("owner: %s %s\n", shmsteer_error_name(rc), shmsteer_last_error());
    return 1;
  }
  refused_decl("empty", "");
  refused_decl("null", NULL);
  refused_decl("no type", "fs");
  refused_decl("unknown type", "fs=tape");
  refused_decl("bad name", "f s=filesystem");
  refused_decl("twice", "fs=filesystem,fs=filesystem");
  refused_decl("one bad of two", "fs=filesystem,x=tape");
  rc = shmsteer_capture_global(owner, "fs", 2, "{}", 2);
  printf("global before serve: %s\n", shmsteer_error_name(rc));
  rc = shmsteer_capture_serve(owner, "fs=filesystem, other=filesystem");
  printf("serve: %s\n", shmsteer_error_name(rc));
  rc = shmsteer_capture_serve(owner, "fs=filesystem");
  printf("serve again: %s\n", shmsteer_error_name(rc));

  shmsteer_capture_fs_options opt = {.root = root, .policy = SHMSTEER_CAPTURE_BLOCK};
  refused_fs("null opt", NULL);
  shmsteer_capture_fs_options bad = opt;
  bad.root = "";
  refused_fs("no root", &bad);
  bad = opt;
  bad.layout = "stacked";
  refused_fs("bad layout", &bad);
  bad = opt;
  bad.name = "nobody";
  refused_fs("undeclared", &bad);
  bad = opt;
  bad.policy = 9;
  refused_fs("bad policy", &bad);
  bad = opt;
  bad.bound_ns = -1;
  refused_fs("negative bound", &bad);

  shmsteer_capture_fs_t *fs = NULL;
  rc = shmsteer_capture_fs_start(ns, SECRET, NULL, &opt, &fs);
  printf("fs start: %s\n", shmsteer_error_name(rc));
  bad = opt;
  refused_fs("taken", &bad);

  // One request, prompt of 3 tokens in one prefill step then one decode step, captured at
  // (post_block, 1) by a stepper of this owner.
  rc = shmsteer_request_admit_json(owner, "r1", 2, capjs, strlen(capjs), NULL);
  printf("admit: %s\n", shmsteer_error_name(rc));
  shmsteer_stepper_t *st = NULL;
  shmsteer_stepper_new(owner, &st);
  rc = shmsteer_stepper_capture_start(st, NULL);
  printf("capture start: %s\n", shmsteer_error_name(rc));
  uint32_t post_block = 0;
  shmsteer_hook_id(owner, "post_block", &post_block);
  float rows[3 * HIDDEN];
  for (int i = 0; i < 3 * HIDDEN; i++) rows[i] = (float)i;
  shmsteer_span prefill = {.id = "r1", .id_len = 2, .start = 0, .end = 3, .phase = SHMSTEER_PHASE_PREFILL};
  shmsteer_span decode = {.id = "r1", .id_len = 2, .start = 0, .end = 1, .phase = SHMSTEER_PHASE_DECODE, .first_position = 3};
  int steps = 0;
  for (int s = 0; s < 2; s++) {
    shmsteer_stepper_begin(st, 0, NULL);
    rc = shmsteer_stepper_apply(st, post_block, 1, rows, (s ? 1 : 3) * HIDDEN, s ? &decode : &prefill, 1);
    steps += rc == SHMSTEER_OK;
    shmsteer_stepper_end(st, NULL);
  }
  printf("steps: %d\n", steps);
  shmsteer_request_end(owner, "r1", 2, NULL);
  char buf[4096];
  size_t n = 0;
  for (int i = 0; i < 1000; i++) {  // 10 s at most
    rc = shmsteer_capture_result_json(owner, "r1", 2, buf, sizeof buf - 1, &n);
    buf[rc == SHMSTEER_OK ? n : 0] = 0;
    if (rc != SHMSTEER_OK || !strstr(buf, "pending")) break;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  printf("result: %s %s\n", shmsteer_error_name(rc), buf);
  shmsteer_capture_fs_stats stats;
  memset(&stats, 0xff, sizeof stats);
  rc = shmsteer_capture_fs_stop(fs, &stats);
  printf("fs stop: %s requests=%llu ok=%llu failed=%llu records=%llu bytes=%llu\n", shmsteer_error_name(rc),
         (unsigned long long)stats.requests, (unsigned long long)stats.ok, (unsigned long long)stats.failed,
         (unsigned long long)stats.records, (unsigned long long)stats.bytes);
  rc = shmsteer_capture_fs_stop(fs, &stats);
  printf("fs stop again: %s\n", shmsteer_error_name(rc));
  shmsteer_stepper_capture_stop(st);
  shmsteer_stepper_free(st);
  rc = shmsteer_close(owner);
  printf("closed: %s\n", shmsteer_error_name(rc));
  return 0;
}
