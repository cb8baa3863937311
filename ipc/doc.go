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
// The owner (NewOwner) creates the region and listens on an abstract unix socket, the attach
// handle; nothing is created on any file system, and the name vanishes with the process.
// Abstract names are visible in /proc/net/unix, so a name is only a rendezvous: trust comes
// from the handshake. For each connection the owner checks the peer's uid with SO_PEERCRED
// (its own uid, plus OwnerOptions.AllowUIDs), then both sides prove the secret:
//
//	client → owner  hello:     version, client nonce
//	owner → client  challenge: version, owner nonce, HMAC(secret, owner label, version, namespace, both nonces)
//	client → owner  proof:     HMAC(secret, client label, version, namespace, both nonces)
//	owner → client  welcome:   limits, region id; the data and reader-slot memfds via SCM_RIGHTS
//
// A refused uid is told so (ErrAuthFailed) after the owner has read its hello, so the
// client's write never fails first and the message is the same whatever the timing. An owner
// that refuses says why in an error frame; a connection closed or reset mid-handshake without
// one, at any byte, is ErrOwnerGone (the owner exited: retry), never ErrAuthFailed.
//
// The owner also listens on a lobby named from the namespace alone. A client with a wrong
// secret finds no handle, knocks at the lobby, and so gets ErrAuthFailed rather than a
// misleading ErrNotYetInitialized; ErrNotYetInitialized means no owner serves the namespace
// at all. Two owners of one namespace are refused (ErrPreviouslyInitialized) whatever their
// secrets.
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
// # Squatting
//
// Abstract socket names have no permissions: any local user can bind a name first, and the
// names are listed in /proc/net/unix. So neither the handle nor the lobby is one name but a
// sequence of K = 64 candidates:
//
//	handle_i = "shmsteer-" + hex(HMAC-SHA256(secret, "shmsteer/handle/v2" 0 u32(len ns) ns u32(i)))
//	lobby_i  = "shmsteer-lobby-" + hex(SHA-256("shmsteer/lobby/v2" 0 u32(len ns) ns u32(i))[:16])
//
// The owner first connects to every lobby candidate: a listener of its own uid there is a
// live owner of the namespace (whatever its secret), and NewOwner fails with
// ErrPreviouslyInitialized naming its pid. It then binds the first free lobby candidate and
// the first free handle candidate. A candidate held by another uid (learnt from SO_PEERCRED of
// a connection to it) is skipped with a warning in the owner's log naming the holder's uid and
// pid; one held by the owner's uid is a live owner (ErrPreviouslyInitialized). If all K are
// held, the owner binds a fresh name drawn at random at this start (see freshHandleName in
// rendezvous.go: a handle's is tagged under the secret), which clients that find no
// candidate look for among the bound names the kernel's socket diagnostics list; so other
// uids cannot keep an owner from starting, nor exhaust names by taking each one a dead owner
// frees. A socket that takes no connection
// (bound without listening, or its backlog full) is looked up in the kernel's socket
// diagnostics (NETLINK_SOCK_DIAG, unix_diag: its uid) and /proc (a pid holding its inode,
// where this process may see it); a lobby listener of the owner's uid with a full backlog is
// so still found as a live owner.
//
// A client connects to the handle candidates in order and, right after connect and before it
// sends a byte, reads SO_PEERCRED of the connected socket (the listener's uid and pid, as they
// were at listen). It closes a listener whose uid is neither its own nor in
// ClientOptions.OwnerUIDs, skips absent names (connect fails at once; so does a full
// backlog), and stops at the first allowed listener; if there is none it tries the lobby
// candidates the same way. A squatter so costs a client one connect, a getsockopt and a
// close (BenchmarkSquatterSkip: 15–72 µs on the shared 2-core development machine, 6 runs
// under varying load), never its timeout: in TestSquatters an attach past a squatter holding
// 2 handle candidates took 0.3–0.5 ms, and in TestSquattersOnly ErrNotYetInitialized came
// after 1.6–4.8 ms, all 128 candidates tried. ErrNotYetInitialized then names the listeners
// it skipped. Nothing stops a process of an allowed uid from squatting: those are trusted.
// These names came with protocol version 2: a version-1 process looks for the version-1 names
// and finds no owner (ErrNotYetInitialized), so run one shmsteer build everywhere.
//
// # RPC
//
// Frames are u32 length (of what follows), u16 op, u32 request id, payload; little-endian.
// A length is checked against the maximum (MaxFrameBytes after the handshake, 512 bytes
// before it) before anything is allocated, and memory then follows the bytes that arrive
// (see Bounded resources). A
// client sends one request at a time and matches replies by id, so a reply that arrives after
// its call timed out is skipped. Ops below MinUserOp are this package's; other packages
// register theirs with Owner.Handle and call them with Client.Call. Handler errors travel as a
// code and a message; RegisterError maps codes to sentinels so errors.Is works in the client.
//
// # Bounded resources
//
// What one client can make the owner hold is bounded, whatever it sends or fails to read:
//
//   - Memory for incoming frames: each connection keeps a buffer of up to 64 KiB; anything
//     larger is charged to OwnerOptions.MaxBufferedBytes (default 2 × MaxFrameBytes), shared
//     by all connections. A frame that finds no room waits, reading nothing, so its sender
//     blocks (backpressure), for at most OwnerOptions.FrameTimeout (default 10 s), and its
//     connection is then dropped with ErrBusy. Frames above 1 MiB are read into an anonymous
//     mapping of their size, whose pages are discarded (MADV_DONTNEED) as soon as the frame
//     is served, so the memory goes back to the system at once rather than waiting for the
//     garbage collector. Measured (TestProcOwnerMemoryBound): three clients each sending
//     48 MiB of a 64 MiB frame and stalling raised an owner's VmRSS from 8 to 104 MiB (it
//     was 309 MB, kept after they closed, before this bound), and it fell back to 8 MiB once
//     they closed.
//   - Time for a frame: once a frame's first byte is in, the rest must come within
//     FrameTimeout, or the connection is dropped (ErrBusy) and its buffer freed; an idle
//     connection between frames may wait for ever.
//   - Writes: every reply write has a deadline (OwnerOptions.WriteTimeout, default 10 s), so
//     a client that pipelines requests and never reads the replies is dropped instead of
//     holding an owner goroutine in Write for ever.
//   - Pending handshakes: at most OwnerOptions.MaxPendingHandshakes (default 64) connections
//     may be accepted and not yet through the handshake (which must end within 5 s). At the
//     bound, or when accept fails for lack of descriptors (EMFILE, ENFILE), the owner closes
//     the oldest pending handshake, so idle connections cannot keep a legitimate attach out;
//     peers of uids not allowed are refused before they count (at most 16 at a time are told
//     why, others are just closed). Measured (TestProcPendingFlood): with the owner's
//     RLIMIT_NOFILE at 1,024 and 1,100 idle connections of its uid held open, an attach took
//     1–6 ms (3 runs), and 10 ms with the limit at 40, where accept hits EMFILE. A flood of new connections faster than a handshake can still evict a
//     legitimate one mid-handshake; it can retry, and only processes of allowed uids can do
//     this.
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
// revocation always fits; past a full mark table the sentinel is an arena entry, the state
// byte alone) in one transaction; Get then returns ErrKeyRevoked, and the owner
// lifts the mark after OwnerOptions.Grace (default 60 s). shm's epochs keep the memory valid
// for readers still holding the key, and zero every freed blob, so the key's bytes vanish once
// no reader can see them. An empty key is a valid key (the seed's values are bytes | None):
// it is not a revocation. The purge schedule is a heap in the owner keyed by
// request id and checked against the sentinel's version, so setting an id again cancels its
// pending purge. Frames and buffers that held keys are zeroed after use.
//
// # Secret
//
// The secret is passed explicitly (OwnerOptions.Secret or SecretFile, and the same in
// ClientOptions) or comes from the environment: SHMSTEER_SECRET_FILE names a file holding it
// (a mounted secret, a systemd credential), so it never sits in /proc/PID/environ, or
// SHMSTEER_SECRET holds it. An explicit option wins over the environment; the same source
// given twice (both options, or both variables) is ErrSecretConflict. A secret file loses one
// trailing newline, may hold at most MaxSecretFileBytes (64 KiB), and an empty one is
// ErrAuthSecretNotDefined; errors about it name the path, never the content.
//
// The secret never appears in logs, errors or panics: Secret formats as "[redacted]" with
// every verb, in JSON and in slog. A Secret nested in an unexported field is printed by fmt
// through reflection, without its methods (and, with a verb such as %s that does not fit a
// pointer, fmt prints what pointers point to), so the bytes are in no field at all: closures
// capture them, and reflection shows a closure only as an address. Owner, Client and
// Registry print their namespace and state only. DropEnv removes both
// variables from the process environment once read.
//
// Processes of the same uid can read a process's memory (/proc/PID/mem, ptrace) and open its
// descriptors (/proc/PID/fd, which hold the region's memfds): every key. NonDumpable
// (OwnerOptions and ClientOptions) clears the process's dumpable flag
// (prctl(PR_SET_DUMPABLE, 0)) before the secret is read, which closes both to other
// processes of the uid (root keeps CAP_SYS_PTRACE) and suppresses core dumps.
package ipc
