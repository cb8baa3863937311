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
//     (unless FSOptions.NoFsync) and renamed into place at Finish; the sidecars' request_id is
//     the client's, the directories are the slugs.
//
// Where it differs from the fork: a tag or request id of exactly "." is refused too (it would
// name the directory above); the fork's sharded layout is refused (ErrBadLayout); the fork's
// check of explicit positions against prefix-cache hits (num_computed_tokens) is the wiring's,
// since a Plan does not know them. Explicit positions must lie inside the prompt, as the fork
// resolves them at admission. The writer's collision policy is the fork's default
// (overwrite); its other policies, writer threads and fd cache are not here.
//
// What is not wired yet: nothing calls this package. The Stepper's, the C ABI's and Python's
// hooks do not copy rows anywhere, there is no capture ring in shared memory, steer.Admission,
// serve's admit endpoint and Python's Owner.admit take no `capture`, there is no
// `shmsteer capture fs` command, no capture results or metrics, and the package's sentinels
// have no C/Python error codes (they get them when capi first returns them).
//
// It must not import serve, mirror or bench; it imports steer only for ModelConfig and its hook
// names. Start with FilesystemSpec.Resolve and RequestFiles; the tests' reader
// (fsread_test.go) is written from the fork's documented format, not from the writer.
package capture
