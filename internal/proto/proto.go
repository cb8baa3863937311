// Package proto owns the numbers every room of shmsteer agrees on, in one place: the shm kinds
// under which each room stores its entries in the region, the RPC ops a worker sends to its
// owner, and the codes of the errors an owner's reply carries, with the codec that turns a code
// back into the sentinel (errors.Is) in the worker.
//
// It is a leaf: it imports only the standard library, so every room (shm's users, ipc,
// steer, serve, mirror, capi, bench) can import it without a cycle. It must not hold behaviour:
// no encoding of payloads (each op's payload belongs to the room that serves it) and no
// sentinel of its own except ErrUnknownOp, which both the transport (ipc) and its users
// (steer) must recognise.
//
// To add a kind or an op: pick the next free number in the room's block below and add it to the
// table (TestTables checks that no two share a number). An error code is a wire line of
// capi/errors.tab instead: `go generate ./capi` renders the Code* constants (codes_gen.go) and
// the Bind of the package that declares the sentinel (its wire_gen.go). A retired number stays
// retired (a comment says so).
package proto

// Kinds of entries in the region (shm.Kind values). Each room owns a block; a kind is never
// reused for another meaning (a region written by an older build must not be misread).
const (
	// KindKey: the key registry (package keys). Key: request id; value: key bytes followed by
	// one state byte. A revoked id has no value but a mark under this kind.
	KindKey = 1
	// KeyStateLive is the state byte that ends a live key's value under KindKey (capi's C
	// reader copies out only values that end in it and leaves every other entry to Go).
	KeyStateLive = 1

	// KindVector .. KindComposedGlobal: steering (package steer), block 16–31.
	KindVector         = 16 // named steering sets, key = name
	KindGlobal         = 17 // global tiers, key = steer's global key
	KindRequest        = 18 // admitted steering per request, key = request id
	KindStatus         = 19 // latch counters, key = steer's status key
	KindComposed       = 20 // a request's composition, key = request id
	KindComposedGlobal = 21 // the global composition
	KindProbe          = 22 // named probe vectors (read by gates), key = name
	KindGates          = 23 // a request's resolved declarative gates, key = request id
	KindVectorMeta     = 24 // a named steering vector's metadata (model hint), key = name
	KindCapture        = 25 // a request's validated capture specs, key = request id

	// KindServe: the service's own entries (package serve), block 48–63.
	KindServe = 48
)

// Op is an RPC op number.
type Op = uint16

// RPC ops. Ops below MinUserOp are the transport's (package ipc: handshake, replies, ping);
// each room above it owns a block of user ops.
const (
	OpHello     Op = 1 // client → owner: version, client nonce
	OpChallenge Op = 2 // owner → client: version, owner nonce, owner proof
	OpProof     Op = 3 // client → owner: client proof
	OpWelcome   Op = 4 // owner → client: region facts; the region's fds ride along (SCM_RIGHTS)
	OpError     Op = 5 // either way in the handshake: code, message
	// 16 and 17 were the key registry's set and remove while it lived in ipc (now the keys
	// block below): never reuse them.
	OpBye      Op = 18 // client closes cleanly (it released its own reader slots)
	OpPing     Op = 19
	OpReplyOK  Op = 0xfffe // reply payload
	OpReplyErr Op = 0xffff // u16 code, message

	// MinUserOp is the first op the owner's Handle accepts; MaxUserOp the last.
	MinUserOp Op = 256
	MaxUserOp Op = 0xfff0

	// Steering writes (package steer), block 256–287.
	OpRegister   Op = 256 // u16 name length (top bit: a hint follows), name, [u16 length, model hint], steering wire encoding
	OpUnregister Op = 257 // name
	OpSetGlobal  Op = 258 // flags byte (1: merge), then the steering wire encoding (none: clear)
	// 259 was OpClearGlobal (now OpSetGlobal without an encoding): never reuse it.
	OpRegisterProbe   Op = 260 // as OpRegister, for a probe vector
	OpUnregisterProbe Op = 261 // as OpUnregister
	OpGateEngaged     Op = 262 // u64 keys of rest_of_conversation gates a worker saw engage

	// Capture (package capture), block 288–319.
	OpCaptureTicket Op = 288 // u8 role (1 consumer, 2 worker), name: a one-time ticket and the hub's socket name

	// The service (package serve), block 320–351.
	OpReportChecksum Op = 320 // u64 step, u64 checksum, worker name
	// 321 and 322 were serve's key set and revoke (now package keys' ops): never reuse.
	OpReportGates Op = 323 // a worker's gate counts: per scope u64 evaluations, fires, engaged; u64 reports missed; worker name
	OpGateWork    Op = 324 // (empty) → the owner's gate counts summed over its workers, JSON

	// The key registry (package keys), block 352–383.
	OpKeySet    Op = 352 // u16 id length, id, key
	OpKeyRemove Op = 353 // id
	OpKeyLimits Op = 354 // empty; reply: u32 the owner's MaxKeyBytes
)
