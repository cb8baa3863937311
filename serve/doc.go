// Package serve is shmsteer's long-lived owner as operators run it (`shmsteer serve`): it owns
// the region (through ipc.Owner and steer.Owner), a JSON control API over HTTP compatible with
// the steering API of the seed's vLLM fork, Prometheus metrics, and the state that survives a
// restart (named vectors with their model hints, global tiers, steering modules, the latch map
// and the conversations' rest_of_conversation gates, in --state-dir).
// It also holds the client side of the CLI's commands (status, keys, vectors, steer global),
// which attach as ipc clients.
//
// It must not touch the region's layout (package shm), the attach protocol (package ipc) or
// the steering model's encoding (package steer): it calls their exported API only.
//
// # Configuration
//
// Defaults, then the TOML file given by --config, then SHMSTEER_* environment variables (the
// upper-cased TOML key: SHMSTEER_HIDDEN, SHMSTEER_STATE_DIR, ...), then flags (the TOML key with
// '-' for '_': --hidden, --state-dir, ...). The secret comes from --secret-file or
// SHMSTEER_SECRET (then removed from the environment); API keys only from --api-key-file (one
// key per line, optionally "tenant:key"; '#' starts a comment), never from the command line.
// SIGHUP re-reads the API key file, so keys rotate without a restart.
//
// # Control API
//
// Auth (--auth, TOML auth, SHMSTEER_AUTH). The default, "keys", is closed: every /v1/ path
// needs "Authorization: Bearer KEY" (with no key file every /v1/ call is refused); /healthz,
// /readyz and /metrics need none. "fork" behaves as the vLLM fork's steering API: with no key
// configured the API is open; with keys, POST /v1/steering/set, /clear, /modules/register,
// /modules/unregister (and serve's /v1/requests/admit, /end and DELETE /v1/conversations) need
// one, while GET reads and the named-vector registry (/vectors/register, /unregister, /import)
// do not (the fork's reasoning: a name grants nothing a request cannot carry inline); a caller
// without a key, or with a wrong one, runs unscoped there, so "fork" cannot keep tenants apart:
// a key file with tenant:key lines is refused at start (ErrForkTenants; keep the default auth
// for tenants). "fork" with no key on an --http address that is not loopback (or unix:) is
// refused at start, and a SIGHUP that would leave either so keeps the old keys: an open API is
// only ever local. Keys are hashed with SHA-256 and compared in
// constant time against every configured key. A key scoped to a tenant may register, list and
// remove only named vectors and modules called "tenant/...", admit and end only request ids
// "tenant/..." in its own conversations, and drop only its own conversations; global steering
// needs an unscoped key. The key file must not be readable by group or others. Tenants have
// quotas (tenant_max_latches and tenant_max_latched_bytes on their conversations' latches: a
// tenant at its cap evicts its own oldest latch, so one tenant cannot evict another's while the
// quotas sum to no more than max_conversations and max_latched_bytes; tenant_max_vectors and
// tenant_max_vector_bytes on the named vectors their keys register, tenant_max_capture_bytes on
// the capture specs their admitted requests not yet ended hold, 429 "quota" beyond), and
// GET /v1/status shows a tenant's key only its tenant's counts and quotas.
//
// What HTTP clients can make serve hold is bounded: the bytes of bodies being read at once, in
// total (max_inflight_body_bytes) and per tenant (max_tenant_body_bytes; beyond each body's
// first 64 KiB, a declared length is charged before a byte is read; more gets 503 busy with
// Retry-After), the time to read a request (read_timeout) and to wait between requests
// (idle_timeout), and the connections open at once (max_connections, lowered at start so that
// 256 file descriptors stay free for workers and state saves under ulimit -n; when full, the
// longest-idle connection is closed).
//
// Bodies are capped (max_body_bytes) and decoded strictly (unknown fields are refused). Errors
// are {"error": message, "type": kind} with a 4xx status for bad input, and change nothing. The
// message holds what the fork's tests look for ("Malformed steering payload" for a structural
// error of a steering payload, "Invalid hook point", "expected vector of size", "not found in
// model", "No vectors or clamps provided", "non-zero", "not found", ...) after serve's
// "shmsteer: <kind>:" prefix, and never shows Go's decoder internals (types, struct names):
// "type" stays serve's (bad_request, unknown_hook, layer_range, hidden_size, non_finite,
// bad_clamp, probe_site, not_found, unauthorized, forbidden, ...), so a client may switch on it.
//
// Steering payloads (the fork's, in /set and /modules/register): a vector tier is {hook:
// {layer: [floats] | {"vector": [floats], "scale": s}}} (both keys of the object form
// required) or, per hook, a packed blob (SteeringHookPacked) {dtype: float16|bfloat16|float32|
// float64, shape: [rows, hidden], layer_indices: [rows], data: base64 little-endian, scales?:
// [rows]}; a clamp tier is {hook: {layer: [{vector, min?, max?, strength?} | {vector, value,
// strength?}]}} (a lone entry object is taken as a list of one), or per hook a packed clamp blob
// (ClampHookPacked) {dtype, shape: [n, hidden], layer_indices: [n] (repeats allowed, order
// kept), data, bounds: [[lo|null, hi|null]], strengths: [n]}, or the fork's wire map {"hooks":
// {hook: {shape, layer_indices, data (float64 rows), lo, hi, strength}}}. null bounds are open
// (±steer.MaxMagnitude, just below); strength defaults to 1 and must be in [0, 1]; directions
// must be non-zero.
//
// Endpoints (the fork's first; every answer is JSON):
//
//   - POST /v1/steering/set: {vectors?, prefill_vectors?, decode_vectors?, clamps?,
//     prefill_clamps?, decode_clamps?, vector_refs?, prefill_vector_refs?, decode_vector_refs?
//     ({name: strength}, serve's), replace?}. Answer {status: "ok", hook_points: [sorted],
//     layers_updated: [sorted], version}. 400 for a malformed payload, nothing in it, an unknown
//     hook, a layer not in the model, a wrong width, a non-finite value, a bad clamp.
//   - POST /v1/steering/clear: no body (or {}). Answer {status: "ok", version}.
//   - GET /v1/steering: {active_layers: {"<layer>": {hook: {norm?, prefill_norm?, decode_norm?}}},
//     clamps: {"<layer>": {hook: count}}, version}: per site the L2 norm of each tier's summed
//     vector (named references resolved), rounded to 6 decimals, zero norms left out, as the
//     fork's workers report them; clamp counts are serve's addition.
//   - GET /v1/steering/layers: {layers: {"<layer>": {hook_points: [sorted hooks]}}}, every
//     layer of the model (flat; no target parameter).
//   - GET /v1/steering/dynamic: {workers: [{worker, step, checksum, age_seconds,
//     action_checksum, action_count, steering_initialized}], determinism: {consistent: true,
//     action_count} | {consistent: false, checksums: {worker: checksum}}, latches: {...serve's
//     latch counters, caps, policy, latch_state_hash}, gates: {requests, probes, by_scope,
//     by_apply} (the gates admitted requests carry), gate_work: GateWork (what the workers'
//     gates did: per scope evaluations, fires, engaged, summed over the workers'
//     steer.ReportGates reports; also in /v1/status, shmsteer status and /metrics as
//     shmsteer_gate_{evaluations,fires,engaged}_total{scope})}. Workers report through
//     ReportChecksum; action_count is the worker's step; determinism compares the workers at
//     the newest step.
//   - POST /v1/steering/vectors/register: {name, kind: "steer" | "probe" (required), packed:
//     {hook: SteeringHookPacked}}. Answer {status, name, kind, version, digest, vectors:
//     {probe: [names], steer: [names]}}. A probe names exactly one (hook, layer) (400
//     probe_site); probes and steering vectors are apart (one name may be both); a probe is
//     never added to hidden states and no steering set can reference one.
//   - POST /v1/steering/vectors/unregister: {name, kind}. Answer as register, plus
//     dropped_references (steer only); 404 {error: "<kind> vector '<name>' not found", type,
//     vectors: {probe, steer}}.
//   - GET /v1/steering/vectors: {vectors: {probe: [names], steer: [names]}, count}, the fork's
//     body; ?details=1 adds serve's details: [{name, kind, version, digest, entries}].
//   - POST /v1/steering/modules/register: {name, kind?: "additive" ("sae_delta" is 501),
//     vectors?, prefill_vectors?, decode_vectors?, clamps?, prefill_clamps?, decode_clamps?}
//     (every form above). Answer {status, name, digest, modules: [sorted]}.
//   - POST /v1/steering/modules/unregister: {name}. Answer {status, name, modules}; 404 "Steering
//     module '<name>' not found. Available: [...]".
//   - GET /v1/steering/modules: {modules: [sorted], count}.
//
// serve's own: POST /v1/requests/admit {request_id, tenant?, conversation?, module?, override?
// (a /set body without replace), compose?: "replace" | "add", steering?: the fork's declarative
// gates [{when, scope, apply}] (steer.DecodeGates; named sources are a tenant's own, inline
// sources packed)} answers {version, source, latched, refused, digest}; a module and an override compose additively at the same (hook, layer), as
// the fork's merge_steering_specs does with steering_name and inline vectors; an unknown module
// is 404 "Unknown steering module '<name>'. Available: [...]". POST /v1/requests/end
// {request_id}, DELETE /v1/conversations/{tenant}/{id}, GET /v1/status, and the vector files
// below. With --capture-consumer NAME=filesystem, serve runs the capture hub (package capture):
// workers register their rings and consumers (`shmsteer capture fs`) attach to it, an admission's
// capture is told to its consumers before the admission answers, its end at POST
// /v1/requests/end, and GET /v1/requests/{id}/capture answers {consumer: {status: "pending" |
// "ok" | "partial_error" | "error" | "not_requested", error, payload: [...]}} (404 without
// consumers declared; a tenant's key reads only its own ids), final once the request ended and
// the consumer published. GET /v1/status has the rings and consumers under "capture", /metrics
// the shmsteer_capture_* series. AdmissionFromRequest turns the steering fields of an OpenAI request body into an admit
// body, validated as the fork's frontend validates them (package doc of AdmissionFromRequest).
//
// Admit and OpenAI bodies go through a fast JSON reader first (parse_fast.go): one pass of
// jsontext (github.com/go-json-experiment/json, the proposed encoding/json/v2's syntax layer)
// that hands out values as slices of the body, and packed float32/bfloat16/float64 rows
// decoded by a table decoder straight into floats (parse_base64.go). It takes only what
// encoding/json and vecfile take, with the same result; everything else (and every error) goes
// the encoding/json way, so the answers are unchanged.
//
// Where serve differs from the fork, on purpose: it has no model engine, so it checks hooks,
// layers and widths against its configured model at the API (the fork asks its workers) and has
// no prefix cache to reset; the default auth is closed (an open control API is a choice, --auth
// fork); /set with replace=false replaces, per tier, the vectors at the (hook, layer) sites it
// names and the clamps at the sites it names, and keeps the rest; int8 and other dtypes numpy
// would take are refused (the steering runs in float32); a "target" in /set or /layers is an
// unknown field or ignored (the fork's draft-model target was reverted); unregistering a named
// vector the global steering references drops those references (recomposing the global
// steering in the same write) and the reply lists the sets affected, "dropped_references":
// ["global"], so no later merging /set fails on the missing name; declarative gates
// ("steering" in an OpenAI body) are passed on to the admission, and workers gate on every
// path (the Stepper and the device path's steer.Batch).
//
// Vector files (package steer/vecfile): POST /v1/steering/vectors/import?name=N[&scale=S]
// [&layers=A-B][&hook=H][&format=gguf|npy|npz|safetensors][&filename=F][&model_hint=ARCH] takes the file as the
// raw request body (not multipart; any content type, e.g. curl --data-binary @happy.gguf) and
// registers it as named vector N like /v1/steering/vectors/register (same scoping: a tenant key
// creates only "tenant/..."; persisted before the reply). scale, layers and hook are llama.cpp's
// --control-vector-scaled, --control-vector-layer-range and the hook a GGUF direction steers
// (default post_block); the format is detected unless given; filename only names the upload in
// errors and helps detection. The body is capped at max_upload_bytes (a declared
// Content-Length above it is refused before reading): 413 "too_large"; an empty body is 400
// "empty body". The GGUF's controlvector.model_hint (none for other formats and chunked
// uploads; model_hint= replaces it, at most 256 bytes of printable UTF-8, else 400
// "bad_model_hint") is stored with the vector (steer.VectorMeta: persisted, mirrored, listed
// as model_hint) and answered as model_hint. A bad file is 422 with
// type corrupt_file, dtype, shape, value_range, tensor_name or no_vectors; bad options are 400
// (bad_options, need_layers, unknown_format, unknown_hook, ...); the message names the file,
// the tensor and the expected shape, and nothing is registered. GET
// /v1/steering/vectors/{name}/export[?format=gguf|npy|npz|safetensors][&model_hint=ARCH] (default safetensors,
// which holds any named vector; a '/' in name as is or %2F; a GGUF carries the vector's stored
// model hint unless model_hint= gives another, empty for none) returns the file as an attachment;
// a format that cannot hold the vector (GGUF: post_block at layers >= 1; npy: one hook) is 422
// "unrepresentable". Import → export → import is bitwise.
//
// # Workers
//
// Workers attach as ipc clients with the same secret and namespace. Serve accepts attaches as
// soon as the region exists, restores the persisted state, then writes KindServe/"ready";
// "listening on ADDR" follows. A worker that must survive owner restarts holds an
// ipc.Follower with Ready: IsReady, so it keeps reading the old region (flagged dead) until
// the restarted serve has restored its state, and then switches. Workers report their step
// checksums with ReportChecksum (RPC OpReportChecksum); GET /v1/steering/dynamic shows them.
// They report their Steppers' gate counts with steer.ReportGates (RPC OpReportGates; C
// shmsteer_stepper_report_gates, Python Stepper.report_gates): serve keeps each worker's last
// report and sums the increments (a worker whose counts went down restarted), and a client
// reads the totals with RPC OpGateWork (`shmsteer status` does).
//
// # Several hosts
//
// With --mirror nats://HOST:PORT serve starts package mirror once the state is restored (so the
// bucket's newer values are applied over it, not overwritten by it) and closes it at shutdown:
// named vectors and global tiers written on this host (API, CLI, workers' RPCs) are published
// to the JetStream bucket (--mirror-bucket, --mirror-creds), and other hosts' changes are
// applied here and persisted like local ones. --host-id (default the hostname) names this host;
// with --mirror-keys, every key written on this host is mirrored sealed: in serve or by a worker,
// the CLI (`shmsteer keys rm`), the C ABI or Python through the owner's key registry (the mirror
// subscribes to its OnChange). GET /v1/status holds a "mirror" object and /metrics the
// shmsteer_mirror_* series (both absent without --mirror); /readyz and local serving never
// depend on NATS. Mirror options without --mirror are a configuration error.
//
// # State
//
// With --state-dir, state.bin holds the names, digests and model hints of the named vectors,
// the global tiers and modules (steer wire encodings), the latch map with its counters and the
// conversations' rest_of_conversation gates with their engaged state (steer's SGCV), after a
// header with a format version and a SHA-256 of the payload; vectors/<digest> holds each named
// vector's encoding once (its digest is checked on restore), so a save rewrites only the small
// state file and new vectors. Every file is written to a temporary file, fsynced and renamed
// (and the directory fsynced), vector files before the state file that names them, after every
// mutating API call before its reply, within persist_interval after a latch change made by an
// admission or a conversation gate change (an admission, a worker's OpGateEngaged report, a
// mirrored entry), and at shutdown. A corrupt or incompatible file, or a missing vector file, stops
// the start with a clear error: the state is never half-loaded. serve flocks the directory
// itself while it runs (no file in it can be deleted out from under the lock), so a second
// serve is refused with ErrStateLocked; it refuses (ErrStateUnsafe) a directory or file in it
// that another uid owns, that group or others can write, or that is a symlink, since whoever
// writes there steers every request; and it removes the temporary files of saves a crash
// interrupted. Keys of the key registry are per-request secrets and are never persisted.
package serve
