// example.c: a C worker that attaches to a shmsteer owner, reads keys and vectors, and round-trips
// a vector through a GGUF file.
//
//   cc example.c -I capi -L python/shmsteer -lshmsteer -Wl,-rpath,python/shmsteer -o example
//   SHMSTEER_SECRET=... ./example NAMESPACE REQUEST_ID VECTOR_NAME
//
// It prints one line per fact it checked, and exits non-zero on the first surprise. The Go test
// TestCExample compiles and runs it against a Go owner.
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shmsteer.h"

static int check(int rc, const char *what) {
  if (rc != SHMSTEER_OK) {
    fprintf(stderr, "%s: %s (%s)\n", what, shmsteer_error_name(rc), shmsteer_last_error());
    exit(1);
  }
  return rc;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s NAMESPACE REQUEST_ID VECTOR_NAME\n", argv[0]);
    return 2;
  }
  const char *ns = argv[1], *id = argv[2], *vec = argv[3];
  if (shmsteer_abi_version() != SHMSTEER_ABI_VERSION) {
    fprintf(stderr, "ABI version mismatch\n");
    return 1;
  }
  shmsteer_t *h = NULL;
  check(shmsteer_attach(ns, NULL, 0, NULL, 0, &h), "attach"); /* secret from SHMSTEER_SECRET */

  /* A key: into a caller buffer. */
  unsigned char key[256];
  size_t n = 0;
  check(shmsteer_key_get(h, id, strlen(id), key, sizeof key, &n), "key_get");
  printf("key %s len=%zu hex=", id, n);
  for (size_t i = 0; i < n; i++) printf("%02x", key[i]);
  printf("\n");

  /* A buffer too small reports the size needed. */
  unsigned char tiny[2];
  size_t need = 0;
  int rc = shmsteer_key_get(h, id, strlen(id), tiny, sizeof tiny, &need);
  printf("small buffer: %s need=%zu\n", shmsteer_error_name(rc), need);

  /* Missing and revoked are distinct. */
  rc = shmsteer_key_get(h, "no-such-request", 15, key, sizeof key, &n);
  printf("missing: %s\n", shmsteer_error_name(rc));
  printf("message: %s\n", shmsteer_last_error());
  check(shmsteer_key_get(h, id, strlen(id), key, sizeof key, &n), "key_get");
  printf("message after a success: \"%s\"\n", shmsteer_last_error());
  char revoked[300];
  snprintf(revoked, sizeof revoked, "%s-revoked", id);
  rc = shmsteer_key_get(h, revoked, strlen(revoked), key, sizeof key, &n);
  printf("revoked: %s\n", shmsteer_error_name(rc));

  /* Several keys through a reader in one call: each item gets its own result. */
  shmsteer_reader_t *rd = NULL;
  check(shmsteer_reader_open(h, &rd), "reader_open");
  unsigned char k0[64], k1[64], k2[64], k3[4];
  shmsteer_key_get_item items[4] = {
      {.id = id, .id_len = strlen(id), .buf = k0, .cap = sizeof k0},
      {.id = "no-such-request", .id_len = 15, .buf = k1, .cap = sizeof k1},
      {.id = revoked, .id_len = strlen(revoked), .buf = k2, .cap = sizeof k2},
      {.id = id, .id_len = strlen(id), .buf = k3, .cap = sizeof k3},
  };
  check(shmsteer_reader_key_get_many(rd, items, 4), "reader_key_get_many");
  for (int i = 0; i < 4; i++)
    printf("many %d: %s len=%zu first=%02x\n", i, shmsteer_error_name(items[i].rc), items[i].len,
           items[i].rc == SHMSTEER_OK ? ((unsigned char *)items[i].buf)[items[i].len - 1] : 0);
  check(shmsteer_reader_close(rd), "reader_close");

  /* A named vector, zero-copy, at a pinned snapshot. */
  shmsteer_snapshot_t *snap = NULL;
  uint64_t pinned = 0;
  check(shmsteer_snapshot_open(h, 0, &snap, &pinned), "snapshot_open");
  shmsteer_vector_info info;
  shmsteer_vector_entry entries[8];
  check(shmsteer_vector_view(snap, vec, strlen(vec), &info, entries, 8), "vector_view");
  printf("vector %s version=%" PRIu64 " entries=%zu digest=", vec, info.version, info.n_entries);
  for (int i = 0; i < 32; i++) printf("%02x", info.digest[i]);
  printf("\n");
  for (size_t e = 0; e < info.n_entries; e++) {
    double sum = 0;
    for (size_t i = 0; i < entries[e].len; i++) sum += entries[e].data[i];
    printf("entry %zu hook=%u layer=%d scale=%g len=%zu sum=%.4f first=%.4f\n", e, entries[e].hook,
           entries[e].layer, entries[e].scale, entries[e].len, sum, entries[e].data[0]);
  }
  check(shmsteer_snapshot_close(snap), "snapshot_close");

  /* Vector files: export the vector to a llama.cpp GGUF control vector (with a model hint) and
   * import it back under another name: the same floats, so the same digest, and the file's
   * model hint stored with it. */
  char path[512], name2[256];
  const char *tmp = getenv("TMPDIR");
  snprintf(path, sizeof path, "%s/shmsteer-example-%d.gguf", tmp && tmp[0] ? tmp : "/tmp", (int)getpid());
  snprintf(name2, sizeof name2, "%s-from-file", vec);
  check(shmsteer_vector_export(h, vec, strlen(vec), path, NULL, "llama"), "vector_export");
  uint64_t fver = 0;
  uint8_t fdigest[32];
  check(shmsteer_vector_import(h, name2, strlen(name2), path, NULL, 0, &fver, fdigest), "vector_import");
  printf("file round trip: digest %s\n", memcmp(fdigest, info.digest, 32) == 0 ? "equal" : "DIFFERENT");
  char hint[64];
  size_t hint_len = 0;
  check(shmsteer_snapshot_open(h, 0, &snap, &pinned), "snapshot_open");
  check(shmsteer_vector_model_hint(snap, name2, strlen(name2), hint, sizeof hint - 1, &hint_len), "vector_model_hint");
  check(shmsteer_snapshot_close(snap), "snapshot_close");
  hint[hint_len] = 0;
  printf("model hint: %s\n", hint);
  const char *opts = "{\"scale\": 0.5, \"layers\": \"1-2\"}";
  check(shmsteer_vector_import(h, name2, strlen(name2), path, opts, strlen(opts), NULL, NULL), "vector_import scaled");
  opts = "{\"scale\": 0}";
  rc = shmsteer_vector_import(h, name2, strlen(name2), path, opts, strlen(opts), NULL, NULL);
  printf("scale 0: %s\n", shmsteer_error_name(rc));
  rc = shmsteer_vector_export(h, "no-such-vector", 14, path, "gguf", NULL);
  printf("export unknown: %s\n", shmsteer_error_name(rc));
  unlink(path);

  /* A child forked after loading gets FORKED at once, never a hang. */
  pid_t pid = fork();
  if (pid == 0) {
    uint64_t v = 0;
    int crc = shmsteer_version(h, &v);
    _exit(crc == SHMSTEER_E_FORKED ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  printf("forked child: %s\n", WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "SHMSTEER_E_FORKED" : "WRONG");

  /* A reader left open when its handle closes is freed with it: its calls answer BAD_HANDLE
   * and read nothing, and a reader opened later (another handle) never answers to it. */
  shmsteer_reader_t *left = NULL;
  check(shmsteer_reader_open(h, &left), "reader_open");
  check(shmsteer_reader_key_get(left, id, strlen(id), key, sizeof key, &n), "reader_key_get");
  check(shmsteer_close(h), "close");
  rc = shmsteer_close(h);
  printf("closed twice: %s\n", shmsteer_error_name(rc));
  rc = shmsteer_reader_key_get(left, id, strlen(id), key, sizeof key, &n);
  printf("reader after close: %s\n", shmsteer_error_name(rc));
  int64_t tls = shmsteer_reader_key_get_tls(left, id);
  printf("reader tls after close: %s\n", tls < 0 ? shmsteer_error_name((int)-tls) : "a key");
  shmsteer_key_get_item item = {.id = id, .id_len = strlen(id), .buf = k0, .cap = sizeof k0};
  rc = shmsteer_reader_key_get_many(left, &item, 1);
  printf("reader many after close: %s\n", shmsteer_error_name(rc));
  check(shmsteer_attach(ns, NULL, 0, NULL, 0, &h), "attach again");
  shmsteer_reader_t *fresh = NULL;
  check(shmsteer_reader_open(h, &fresh), "reader_open again");
  rc = shmsteer_reader_key_get(left, id, strlen(id), key, sizeof key, &n);
  printf("old reader beside a new one: %s\n", shmsteer_error_name(rc));
  check(shmsteer_reader_key_get(fresh, id, strlen(id), key, sizeof key, &n), "new reader_key_get");
  printf("new reader: len=%zu\n", n);
  rc = shmsteer_reader_close(left);
  printf("reader close after its handle closed: %s\n", shmsteer_error_name(rc));
  check(shmsteer_reader_key_get(fresh, id, strlen(id), key, sizeof key, &n), "new reader_key_get after");
  check(shmsteer_reader_close(fresh), "reader_close");
  check(shmsteer_close(h), "close");
  return 0;
}
