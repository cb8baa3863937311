// Package serve is shmsteer's long-lived owner as operators run it (`shmsteer serve`): it owns
// the region (through ipc.Owner and steer.Engine), a JSON control API over HTTP compatible with
// the steering API of the seed's vLLM fork, Prometheus metrics, and the state that survives a
// restart (named vectors, global tiers, steering modules and the latch map, in --state-dir).
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
// Every /v1/ path needs "Authorization: Bearer KEY" (closed by default: with no key file every
// /v1/ call is refused); /healthz, /readyz and /metrics need none. Keys are hashed with
// SHA-256 and compared in constant time against every configured key. A key scoped to a
// tenant may register, list and remove only named vectors and modules called "tenant/...",
// admit and end only request ids "tenant/..." in its own conversations, and drop only its own
// conversations; global steering needs an unscoped key. The key file must not be readable by
// group or others. Bodies are capped
// (max_body_bytes) and decoded strictly (unknown fields are refused). Errors are
// {"error": message, "type": kind} with a 4xx status for bad input, and change nothing.
//
// Compatible with the fork: POST /v1/steering/set (vectors, prefill_vectors, decode_vectors in
// the plain form {hook: {layer: [floats] | {vector, scale}}} or packed {hook: {dtype, shape,
// layer_indices, data, scales?}}; clamps, prefill_clamps, decode_clamps as {hook: {layer:
// [{vector, min?, max?, strength?} | {vector, value}]}}; replace; target "main" or absent,
// "draft" is 501), POST /v1/steering/clear, GET /v1/steering, GET /v1/steering/layers,
// POST /v1/steering/vectors/register|unregister and GET /v1/steering/vectors (kind "steer";
// "probe" is 501), POST /v1/steering/modules/register|unregister and GET /v1/steering/modules
// (kind "additive"; "sae_delta" is 501), GET /v1/steering/dynamic.
//
// Choices where the fork is unclear: /set with replace=false replaces, per tier, the vectors at
// the (hook, layer) sites it names and the clamps at the sites it names, and keeps the rest;
// open clamp bounds become ±steer.MaxMagnitude; GET /v1/steering reports per layer and hook the norm of
// each tier's summed vector (base, prefill, decode) and the number of clamps; unregistering a
// named vector the global steering references drops those references (recomposing the global
// steering in the same write) and the reply lists the sets affected, "dropped_references":
// ["global"], so no later merging /set fails on the missing name. Additions:
// *_vector_refs ({name: strength}) in /set, POST /v1/requests/admit and /v1/requests/end (for a
// scheduler that is not an ipc client), DELETE /v1/conversations/{tenant}/{id}, GET /v1/status.
//
// Vector files (package steer/vecfile): POST /v1/steering/vectors/import?name=N[&scale=S]
// [&layers=A-B][&hook=H][&format=gguf|npy|npz|safetensors][&filename=F] takes the file as the
// raw request body (not multipart; any content type, e.g. curl --data-binary @happy.gguf) and
// registers it as named vector N like /v1/steering/vectors/register (same scoping: a tenant key
// creates only "tenant/..."; persisted before the reply). scale, layers and hook are llama.cpp's
// --control-vector-scaled, --control-vector-layer-range and the hook a GGUF direction steers
// (default post_block); the format is detected unless given; filename only names the upload in
// errors and helps detection. The body is capped at max_upload_bytes (a declared
// Content-Length above it is refused before reading): 413 "too_large". A bad file is 422 with
// type corrupt_file, dtype, shape, value_range, tensor_name or no_vectors; bad options are 400
// (bad_options, need_layers, unknown_format, unknown_hook, ...); the message names the file,
// the tensor and the expected shape, and nothing is registered. GET
// /v1/steering/vectors/{name}/export[?format=gguf|npy|npz|safetensors] (default safetensors,
// which holds any named vector; a '/' in name as is or %2F) returns the file as an attachment;
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
//
// # Several hosts
//
// With --mirror nats://HOST:PORT serve starts package mirror once the state is restored (so the
// bucket's newer values are applied over it, not overwritten by it) and closes it at shutdown:
// named vectors and global tiers written on this host (API, CLI, workers' RPCs) are published
// to the JetStream bucket (--mirror-bucket, --mirror-creds), and other hosts' changes are
// applied here and persisted like local ones. --host-id (default the hostname) names this host;
// with --mirror-keys, keys written through serve's OpKeySet and OpKeyRemove (SetKey,
// RemoveKey; `shmsteer keys rm`) are mirrored sealed; keys written with ipc's own
// Client.Keys() stay on this host. GET /v1/status holds a "mirror" object and /metrics the
// shmsteer_mirror_* series (both absent without --mirror); /readyz and local serving never
// depend on NATS. Mirror options without --mirror are a configuration error.
//
// # State
//
// With --state-dir, state.bin holds the names and digests of the named vectors, the global
// tiers and modules (steer wire encodings), and the latch map with its counters, after a
// header with a format version and a SHA-256 of the payload; vectors/<digest> holds each named
// vector's encoding once (its digest is checked on restore), so a save rewrites only the small
// state file and new vectors. Every file is written to a temporary file, fsynced and renamed
// (and the directory fsynced), vector files before the state file that names them, after every
// mutating API call before its reply, within persist_interval after a latch change made by an
// admission, and at shutdown. A corrupt or incompatible file, or a missing vector file, stops
// the start with a clear error: the state is never half-loaded. serve flocks the directory
// itself while it runs (no file in it can be deleted out from under the lock), so a second
// serve is refused with ErrStateLocked; it refuses (ErrStateUnsafe) a directory or file in it
// that another uid owns, that group or others can write, or that is a symlink, since whoever
// writes there steers every request; and it removes the temporary files of saves a crash
// interrupted. Keys of the key registry are per-request secrets and are never persisted.
package serve
