// Package ipc owns how shmsteer processes find and trust each other: the attach handle derived
// from a shared secret, the mutual handshake, passing the region's file descriptors, the small
// binary RPCs that carry clients' writes to the owner, and the per-request key registry built on
// them (the replacement for the seed's Python manager and shared dict).
//
// It must not touch the region's layout (package shm owns it; ipc only calls shm's exported
// API) nor steering (package steer registers its own RPC ops through Owner.Handle and its
// errors through RegisterError).
//
// # Attach
//
// The owner (NewOwner) creates the region and listens on an abstract unix socket named
// "shmsteer-" + hex(HMAC-SHA256(secret, "shmsteer/handle/v1" || namespace)); nothing is
// created on any file system, and the name vanishes with the process. Abstract names are
// visible in /proc/net/unix, so the name is only a rendezvous: trust comes from the handshake.
// For each connection the owner checks the peer's uid with SO_PEERCRED (its own uid, plus
// OwnerOptions.AllowUIDs), then both sides prove the secret:
//
//	client → owner  hello:     version, client nonce
//	owner → client  challenge: version, owner nonce, HMAC(secret, owner label, version, namespace, both nonces)
//	client → owner  proof:     HMAC(secret, client label, version, namespace, both nonces)
//	owner → client  welcome:   limits, region id; the data and reader-slot memfds via SCM_RIGHTS
//
// The owner also listens on a lobby named from the namespace alone (lobbyName) and runs the same
// handshake there. A client with a wrong secret finds no handle, knocks at the lobby, and so
// gets ErrAuthFailed rather than a misleading ErrNotYetInitialized; ErrNotYetInitialized means
// no owner serves the namespace at all. Two owners of one namespace are refused
// (ErrPreviouslyInitialized) whatever their secrets.
//
// Proofs are compared with hmac.Equal; each covers a fresh nonce from each side, so a
// recorded handshake replayed in either direction fails, and the distinct labels keep one
// side's proof from serving as the other's. The client checks the owner's proof before it
// sends its own. A version byte in every handshake frame makes a protocol mismatch
// ErrIncompatible rather than garbage; a region layout mismatch found by shm.Open is
// ErrIncompatible too (and matches shm.ErrIncompatible).
//
// A client maps the data read-only (the memfd is sealed) and reads lock-free. When its socket
// closes without a goodbye (crash, SIGKILL), the owner frees the process's reader slots as
// soon as the process is gone (Region.SweepReaders: a slot's lease is an OFD lock the kernel
// drops with the process, in any PID namespace), and it sweeps every 250 ms. When the owner
// dies, clients keep the mapping and read the last state; RPCs return ErrOwnerGone.
//
// # RPC
//
// Frames are u32 length (of what follows), u16 op, u32 request id, payload; little-endian.
// A length is checked against the maximum (MaxFrameBytes after the handshake, 512 bytes
// before it) before anything is allocated, and buffers then grow only as bytes arrive. A
// client sends one request at a time and matches replies by id, so a reply that arrives after
// its call timed out is skipped. Ops below MinUserOp are this package's; other packages
// register theirs with Owner.Handle and call them with Client.Call. Handler errors travel as a
// code and a message; RegisterError maps codes to sentinels so errors.Is works in the client.
//
// Both ends use Go's netpoller (net.UnixConn with deadlines). Switching the sockets to
// blocking mode after the handshake was tried and measured between two processes on the
// 2-core development machine: an empty RPC took about 30 µs blocking on both sides, 60–70 µs
// with only the client blocking, and 12–22 µs through the netpoller on both sides (blocked
// threads make the runtime hand off Ps and wake spare threads), so the netpoller stays.
//
// # Spinning
//
// Most of an RPC's time is the two cross-process wakeups through the netpoller (client parked
// for the reply, owner parked for the request). So a waiting side first polls its socket
// without parking, for at most SpinWait (ClientOptions and OwnerOptions; default
// DefaultSpinWait, 50 µs; negative turns it off), and parks only if nothing came: a client
// after sending a request, until the reply or min(SpinWait, the call's deadline); the owner
// after answering a request, until that connection's next request, so a worker's
// back-to-back RPCs skip the owner's wakeup too. Between polls the spinner yields the CPU
// (sched_yield): on the 2-core machine a busy poll without yielding made RPCs slower than no
// spin at all (Ping 20–35 µs, Set 25–40 µs with both sides spinning), since the spinners
// starve the very threads they wait for. Medians of 4–5 runs there, separate processes
// (BenchmarkChildPing, BenchmarkChildSetRPC and their NoSpin variants): an empty RPC went
// from about 17 µs to 9 µs, a key Set from about 22 µs to 12–13 µs.
//
// The cost is CPU, and only right after RPC traffic: an idle owner or client spins not at
// all. A client burns at most SpinWait per call while it waits for its reply (less when the
// reply comes sooner, which is the point). The owner burns at most SpinWait per answered
// request, on the goroutine serving that connection, when no next request follows: at most
// 5% of a core for a client sending an isolated request every millisecond, and nothing
// between bursts. Where CPU matters more than RPC latency, set SpinWait negative.
//
// # Key registry
//
// Registry stores request id → key under KindKey: value = key bytes + one state byte (live).
// Remove deletes the value and marks the id (shm's mark table: 32 bytes, no arena space, so a
// revocation always fits) in one transaction; Get then returns ErrKeyRevoked, and the owner
// lifts the mark after OwnerOptions.Grace (default 60 s). shm's epochs keep the memory valid
// for readers still holding the key, and zero every freed blob, so the key's bytes vanish once
// no reader can see them. An empty key is a valid key (the seed's values are bytes | None):
// it is not a revocation. The purge schedule is a heap in the owner keyed by
// request id and checked against the sentinel's version, so setting an id again cancels its
// pending purge. Frames and buffers that held keys are zeroed after use.
//
// # Secret
//
// The secret comes from SHMSTEER_SECRET or is passed explicitly (Secret). It never appears in
// logs, errors or panics: Secret formats as "[redacted]" with every verb, and DropEnv removes
// the variable from the process environment once read.
package ipc
