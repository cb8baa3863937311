// Package capture owns activation capture's self-contained pieces (issue 24): the per-request
// capture specs and their validation against a steer.ModelConfig, the resolution of a spec's
// hook and position selectors into (hook, layer) sites and the rows of a span to copy, and the
// filesystem consumer's spec and on-disk layout exactly as the RhizoNymph vllm fork's
// filesystem consumer reads and writes them (per_file and packed).
//
// What is here:
//
//   - DecodeRequest reads a request's `capture` object, {consumer_name: spec}, keeping each
//     consumer's spec as raw JSON for that consumer to decode.
//   - DecodeFilesystemSpec reads the fork's FilesystemCaptureRequest (request_id, tag, hooks,
//     positions, layout) strictly; FilesystemSpec.Resolve validates it against a ModelConfig and
//     a prompt length and returns a Plan: the slugged tag and request id (Slug), the sorted
//     (hook, layer) Sites and the resolved Positions. Plan.Rows says which rows of a span whose
//     first row is at absolute position first are captured.
//   - OpenRequest and RequestFiles write one request's Records (layer, hook, positions, dtype
//     float32/bfloat16/float16, shape, raw little-endian rows) under
//     {root}/{tag}/{request_id}/: per_file, {layer}_{hook}.bin and its .json sidecar
//     (request_id, layer, hook, shape, dtype, positions) per site; packed, packed.bin and a
//     packed.json index (request_id, layout, dtype, entries of layer, hook, offset, nbytes,
//     shape, positions; one entry per record). Each file is written as {name}.tmp, synced
//     (unless FSOptions.NoFsync) and renamed into place at Finish; the directories are the
//     slugs of the spec's tag and request_id, the sidecars' request_id is the engine's request
//     id (as the fork's sidecars carry its engine request id).
//   - CreateRing / OpenRing (Linux): the per-worker capture ring, in a writable memfd of its
//     own (never the sealed data region). One RingWriter frames records (request id, layer,
//     hook, positions, dtype, shape, rows) and publishes each with one atomic store, so a
//     writer killed mid-record leaves nothing visible; up to MaxRingSlots consumers Attach
//     with a policy, Block (the writer waits its bound for them, then drops) or Drop (at
//     once), and read records in order as views of the mapping (RingReader.Next, Release).
//     Drops are counted in the ring (RingStats) and in each lagging consumer's slot; a
//     lagging consumer whose process is gone (its pid, in the writer's PID namespace) has its
//     slot reclaimed, so it holds the writer back no more. Every frame offset and length is
//     checked against the published bytes (ErrRingCorrupt).
//
// Where it differs from the fork: a tag or request id of exactly "." is refused too (it would
// name the directory above); the fork's sharded layout is refused (ErrBadLayout); the fork's
// check of explicit positions against prefix-cache hits (num_computed_tokens) is the wiring's,
// since a Plan does not know them. Explicit positions must lie inside the prompt, as the fork
// resolves them at admission. The writer's collision policy is the fork's default
// (overwrite); its other policies, writer threads and fd cache are not here.
//
// What is not wired yet: nothing calls this package. The Stepper's, the C ABI's and Python's
// hooks do not copy rows into the ring (and no GPU D2H path exists); there is no rank choice
// under tensor parallelism; the ring's memfd is not handed to consumers over ipc (the tests
// pass it with cmd.ExtraFiles); a dead consumer in another PID namespace is not reclaimed (the
// wiring should record its peer-credential pid) and its requests do not end with status
// error; nothing drains the ring into RequestFiles; steer.Admission, serve's admit endpoint
// and Python's Owner.admit take no `capture`; there is no `shmsteer capture fs` command, no
// Python shmsteer.capture, no capture results, status or metrics; and the package's sentinels
// have no C/Python error codes (they get them when capi first returns them).
//
// It must not import serve, mirror or bench; it imports steer only for ModelConfig and its hook
// names. Start with FilesystemSpec.Resolve and RequestFiles; the tests' readers
// (fsread_test.go in Go, testdata/fork_reader.py in NumPy) are written from the fork's
// documented format, not from the writer. BenchmarkRingAppend compares a ring append with a
// plain copy of the same bytes.
package capture
