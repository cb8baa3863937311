// keys.get.capi_ns for `shmsteer bench`: a key get from a C program through libshmsteer.so.
//
// "owner NKEYS VALUE_SIZE": starts an owner in this process (shmsteer_owner_start), stores NKEYS
// 36-character keys with VALUE_SIZE-byte values, then runs this program again as a separate
// reader process (posix_spawn: fork+exec, so the reader loads the library afresh) that inherits
// stdin and stdout, and waits for it.
// "reader NS NKEYS": attaches (secret from SHMSTEER_SECRET), opens a shmsteer_reader_t (a
// reader slot of its own, as the Go keys.Reader the keys.get.shmsteer figure uses) and answers the
// round protocol of bench/child.go: "get N" runs N gets round-robin, timed with
// CLOCK_MONOTONIC around the loop only; "getmany N" gets the same N keys through
// shmsteer_reader_key_get_many in batches of MANY ids.
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shmsteer.h"

extern char **environ;

static void fail(const char *what, int rc) {
  printf("{\"error\":\"%s: %s\"}\n", what, shmsteer_error_name(rc));
  fflush(stdout);
  exit(1);
}

// Deterministic UUID-shaped ids (8-4-4-4-12 hex), the same in both processes.
static char (*make_ids(int n))[37] {
  char (*ids)[37] = calloc((size_t)n, sizeof *ids);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < n; i++) {
    char h[33];
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t a = x;
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    snprintf(h, sizeof h, "%016llx%016llx", (unsigned long long)a, (unsigned long long)x);
    snprintf(ids[i], 37, "%.8s-%.4s-%.4s-%.4s-%.12s", h, h + 8, h + 12, h + 16, h + 20);
  }
  return ids;
}

static int run_owner(const char *self, int n, int vsize) {
  char ns[64], secret[64];
  snprintf(ns, sizeof ns, "bench-capi-%d-%ld", (int)getpid(), (long)time(NULL));
  snprintf(secret, sizeof secret, "capi-bench-%d-%ld-%d", (int)getpid(), (long)clock(), rand());
  shmsteer_owner_config cfg = {.hidden = 1, .layers = 1};
  shmsteer_t *o = NULL;
  int rc = shmsteer_owner_start(ns, secret, strlen(secret), NULL, &cfg, &o);
  if (rc) fail("owner_start", rc);
  char (*ids)[37] = make_ids(n);
  unsigned char *val = malloc((size_t)vsize);
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < vsize; j++) val[j] = (unsigned char)(i * 31 + j);
    if ((rc = shmsteer_key_set(o, ids[i], 36, val, (size_t)vsize))) fail("key_set", rc);
  }
  setenv("SHMSTEER_SECRET", secret, 1);
  char nbuf[32];
  snprintf(nbuf, sizeof nbuf, "%d", n);
  char *argv[] = {(char *)self, "reader", ns, nbuf, NULL};
  pid_t pid;
  if (posix_spawn(&pid, self, NULL, NULL, argv, environ) != 0) {
    printf("{\"error\":\"posix_spawn failed\"}\n");
    return 1;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  shmsteer_close(o);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

#define MANY 64

static int run_reader(const char *ns, int n) {
  shmsteer_t *h = NULL;
  int rc = shmsteer_attach(ns, NULL, 0, NULL, 0, &h);
  if (rc) fail("attach", rc);
  shmsteer_reader_t *r = NULL;
  if ((rc = shmsteer_reader_open(h, &r))) fail("reader_open", rc);
  char (*ids)[37] = make_ids(n);
  unsigned char buf[256];
  size_t len = 0;
  static shmsteer_key_get_item items[MANY];
  static unsigned char keys[MANY][64];
  for (int i = 0; i < n; i++)
    if ((rc = shmsteer_reader_key_get(r, ids[i], 36, buf, sizeof buf, &len))) fail("key_get", rc);
  printf("{\"ready\":true,\"info\":\"C reader, libshmsteer ABI %d\"}\n", shmsteer_abi_version());
  fflush(stdout);
  char line[128];
  unsigned acc = 0;
  while (fgets(line, sizeof line, stdin)) {
    char op[16];
    long iters = 0;
    int many = 0;
    if (sscanf(line, "%15s %ld", op, &iters) == 2 && strcmp(op, "getmany") == 0) many = 1;
    else if (sscanf(line, "%15s %ld", op, &iters) != 2 || strcmp(op, "get") != 0) {
      if (strncmp(line, "quit", 4) == 0) break;
      printf("{\"error\":\"bad command\"}\n");
      fflush(stdout);
      continue;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (many) {
      for (long i = 0; i < iters; i += MANY) {
        long m = iters - i < MANY ? iters - i : MANY;
        for (long j = 0; j < m; j++) {
          items[j].id = ids[(i + j) & (n - 1)];
          items[j].id_len = 36;
          items[j].buf = keys[j];
          items[j].cap = sizeof keys[j];
        }
        rc = shmsteer_reader_key_get_many(r, items, (size_t)m);
        for (long j = 0; j < m; j++) acc += keys[j][i & 31] + (unsigned)items[j].rc;
        acc += (unsigned)rc;
      }
    } else {
      for (long i = 0; i < iters; i++) {
        rc = shmsteer_reader_key_get(r, ids[i & (n - 1)], 36, buf, sizeof buf, &len);
        acc += buf[i & 31] + (unsigned)rc;
      }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long long ns_total = (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
    printf("{\"ns\":%lld}\n", ns_total + (acc == 0xFFFFFFFFu)); // acc keeps the gets observable
    fflush(stdout);
  }
  shmsteer_reader_close(r);
  shmsteer_close(h);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "owner") == 0) return run_owner(argv[0], atoi(argv[2]), atoi(argv[3]));
  if (argc == 4 && strcmp(argv[1], "reader") == 0) return run_reader(argv[2], atoi(argv[3]));
  fprintf(stderr, "usage: %s owner NKEYS VALUE_SIZE | reader NS NKEYS\n", argv[0]);
  return 2;
}
