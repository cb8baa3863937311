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
//     slugs of the spec's tag and request_id (Slug: the fork's names where they are of
//     [a-zA-Z0-9._-], other bytes %XX, so no two names share one), under @{tenant} for a
//     tenant's request ("tenant/..." engine ids: TenantDir), and a request's own directory
//     is created exclusively (a clash is an error for the later request); the sidecars'
//     request_id is the engine's request id (as the fork's sidecars carry its engine request
//     id).
//   - CreateRing / OpenRing (Linux): the per-worker capture ring, in a writable memfd of its
//     own (never the sealed data region), sealed against shrinking and growing once sized
//     (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL): OpenRing, and so the hub at a worker's
//     registration, refuses a memfd without those seals or not of its header's size before
//     mapping it, so no worker can make the owner's or a consumer's reads fault. One
//     RingWriter frames records (request id, layer,
//     hook, positions, dtype, shape, rows) and publishes each with one atomic store, so a
//     writer killed mid-record leaves nothing visible; up to MaxRingSlots consumers Attach
//     with a policy, Block (the writer waits its bound for them, then drops) or Drop (at
//     once), and read records in order as views of the mapping (RingReader.Next, Release).
//     Drops are counted in the ring (RingStats) and in each lagging consumer's slot; a
//     lagging consumer whose process is gone (its pid, in the writer's PID namespace) has its
//     slot reclaimed, so it holds the writer back no more. Every frame offset and length is
//     checked against the published bytes (ErrRingCorrupt).
//   - The handoff (Linux): the owner runs a Hub (NewHub with the consumers it declares, Serve
//     to register the OpCaptureTicket RPC). A worker calls RegisterWorker over its ipc client:
//     it creates its ring and hands the memfd to the hub (SCM_RIGHTS on a capture connection
//     of its own, opened with a one-time ticket the RPC gives over the authenticated ipc
//     connection). A consumer calls AttachConsumer (secret, namespace, a declared consumer
//     name, its policy and bound) or NewConsumer over a client it has: it receives every
//     worker's ring, now and as workers come, attaches a slot on each and tells the hub, which
//     records the consumer's peer-credential pid in the slot (so a worker in the owner's PID
//     namespace reclaims a dead consumer of another namespace) and frees its slots when its
//     connection closes. RegisterWorker returns once every consumer attached at the time has
//     a slot on the new ring (the hub waits a bounded time for consumers that do not read),
//     so what the worker captures from then on reaches them.
//   - Consumer.Next is one stream per consumer: a captured request's begin (its spec and
//     prompt length; Hub.Begin writes it into the consumer's socket before the admission
//     returns, so before any step, and never waits: a consumer behind on its notices is not
//     told, its result for the request error at once; ends and rings queue per consumer,
//     bounded, a consumer whose queue fills disconnected; both counted in Hub.Status),
//     its records as views of the ring (bitwise what the worker appended; records of requests
//     not captured for this consumer are skipped), and its end (Hub.End) after every record
//     of it; NextBatch returns the records that follow one another in one call, every view
//     valid until the next (RingReader.NextHeld), and NextRun a run of them of one hook and
//     shape, at one stride in the ring when asked (one strided view covers it; the C ABI's
//     shmsteer_capture_next_run and copy_run). The consumer publishes its result (Publish); Hub.Result gives each declared
//     consumer's {status, error, payload}: pending, ok, partial_error, error (also when the
//     consumer leaves or dies before publishing, or was not attached at admission),
//     not_requested. Hub.Status reads the rings' and the consumers' counters, with totals that
//     keep the counts of rings whose worker left.
//   - RunFilesystem is the filesystem consumer (`shmsteer capture fs`): each captured
//     request's spec is decoded and resolved at its begin, its records written with
//     RequestFiles, and at its end the paths published (ok; partial_error when records were
//     dropped for it; error when its spec does not resolve or a write fails). per_file's
//     Finish syncs all of a request's files at once (their fsyncs overlap).
//
// Where it differs from the fork: a tag or request id of exactly "." is refused too (it would
// name the directory above); the fork's sharded layout is refused (ErrBadLayout); the fork's
// check of explicit positions against prefix-cache hits (num_computed_tokens) is the wiring's,
// since a Plan does not know them. Explicit positions must lie inside the prompt, as the fork
// resolves them at admission. The writer's collision policy is the fork's default
// (overwrite); its other policies, writer threads and fd cache are not here.
//
// Admission: Validators turns the owner's declared consumers ({name: type}; ParseDeclaration
// reads serve's --capture-consumer NAME=TYPE, TypeFilesystem the one type) into
// steer.Options.CaptureConsumers; ValidateFilesystem decodes and resolves a request's spec at
// Admit, and steer stores the raw spec with the plan's sites and positions (Plan.Select) with
// the request, read back by Engine.Capture in workers and consumers alike. A declared
// consumer may have a global spec (GlobalSpecs, serve's --capture-global NAME=@FILE;
// steer.Options.CaptureGlobal), declared by the owner as the fork's engine-side consumer
// config is: every request that does not name that consumer is captured with it, under the
// request's own id (a filesystem global spec has no request_id), a request's own spec for the
// consumer replacing it (the fork's merge rule). It is validated at declaration and at
// steer.Open as a request's spec is; one that cannot apply to a request (no prompt_len for a
// prompt selector, say) is skipped for it, the request admitted and that consumer's result
// an error saying why; results of a global spec carry "global": true. The position
// selectors are steer.CapturePositions (Plan.Rows and Selects call them), which the hooks run.
//
// The hooks: RingSink is the steer.CaptureSink over a RingWriter. A Stepper given it
// (Stepper.SetCapture; only the writing rank under tensor parallelism) copies, at each site its
// Apply (float32) or Capture (bfloat16, float16) sees and before steering it, the rows the
// step's captured requests select, one record per (site, request): AppendRows copies them
// from the hidden state straight into the ring with non-temporal stores, held and published
// once per site (Hold, Flush). A device worker's Batch plans the same rows (CaptureSites,
// CaptureRows) and takes back each site's gathered rows (Batch.Capture).
//
// The C ABI's hooks capture as the Stepper's do (shmsteer_stepper_capture_start registers a
// ring of the stepper's own with the hub; shmsteer_stepper_capture, shmsteer_batch_capture),
// and Python's SteeringHooks.start_capture on the native and device paths (one device-to-host
// copy per site into pinned memory on a GPU; in static CUDA-graph mode the graph writes the
// rows into persistent device buffers and the host makes one device-to-host copy per step).
//
// serve runs a Hub with --capture-consumer; the C
// ABI's shmsteer_capture_* and Python's shmsteer.capture are the consumer through it
// (shmsteer_capture_serve makes a Python-hosted owner serve one). A consumer that attaches
// while a request runs sees only the records appended after its slot exists (it gets no begin
// for requests admitted before it attached, so it skips them).
//
// It must not import serve, mirror or bench; it imports steer (ModelConfig, hook names, the
// sink and admission types), ipc (a consumer's attach) and internal/proto (the ticket op). Start with FilesystemSpec.Resolve and RequestFiles; the tests' readers
// (fsread_test.go in Go, testdata/fork_reader.py in NumPy) are written from the fork's
// documented format, not from the writer. BenchmarkRingAppend compares a ring append with a
// plain copy of the same bytes; BenchmarkCaptureHookCost a captured decode step with one;
// BenchmarkConsumerRead a Go consumer's read of a step with a copy of the same bytes;
// BenchmarkFilesystemConsumer the filesystem consumer with dd to the same directory.
package capture
