// Package ipc owns how shmsteer processes find and trust each other: the attach handle derived
// from a shared secret, the mutual handshake, passing the region's file descriptors, the small
// binary RPCs that carry clients' writes to the owner (the replacement for the seed's Python
// manager).
//
// It must not touch the region's layout (package shm owns it; ipc only calls shm's exported
// API), nor what the rooms above it store and send: steering (package steer) and the key
// registry (package keys) register their own RPC ops through Owner.Handle, and a room that
// runs goroutines on the owner's region stops them in Owner.OnClose. The secret never appears
// in a log, an error or a panic.
//
// ipc is Linux-only and does not build elsewhere: it needs abstract unix sockets, SO_PEERCRED,
// SCM_RIGHTS, memfds and OFD locks (through shm) and the kernel's socket diagnostics. (shm and
// steer build on other systems, where Create and Open return shm.ErrUnsupported.)
//
// To start: the owner calls NewOwner (it creates the region and serves attaches until Close),
// each worker Attach with the same secret and namespace (or Follow, which re-attaches across
// owner restarts); both read the region through Region(), and the rooms above open their
// state on them (keys.Open and keys.Attach, steer.Open).
//
// # Attach
//
// The owner listens on an abstract socket, the attach handle: nothing is created on any file
// system and the name vanishes with the process. Names are only a rendezvous; trust comes from
// the handshake. The owner checks the peer's uid with SO_PEERCRED (its own, plus
// OwnerOptions.AllowUIDs), then both sides prove the secret:
//
//	client → owner  hello:     version, client nonce
//	owner → client  challenge: version, owner nonce, HMAC(secret, owner label, version, namespace, both nonces)
//	client → owner  proof:     HMAC(secret, client label, version, namespace, both nonces)
//	owner → client  welcome:   limits, region id; the data and reader-slot memfds via SCM_RIGHTS
//
// Proofs cover a fresh nonce from each side and distinct labels, and are compared with
// hmac.Equal; the client checks the owner's proof before sending its own. A version byte in
// every frame makes a protocol mismatch ErrIncompatible, as is a region layout mismatch found by
// shm.Open (it matches shm.ErrIncompatible). A lobby named from the namespace alone tells a
// client with a wrong secret ErrAuthFailed rather than ErrNotYetInitialized, which means no
// owner serves the namespace; a second owner of a namespace gets ErrPreviouslyInitialized. An
// owner that refuses says why in an error frame; a connection closed or reset mid-handshake
// without one, at any byte, is ErrOwnerGone (the owner exited: retry), never ErrAuthFailed.
//
// A client maps the data read-only (the memfd is sealed) and reads lock-free. The owner frees a
// dead client's reader slots as soon as its process is gone (Region.SweepReaders). When the
// owner dies, clients keep reading the last state and RPCs return ErrOwnerGone.
//
// # Squatting
//
// Abstract names have no permissions, so the handle and the lobby are each a sequence of 64
// candidate names (rendezvous.go). The owner skips candidates held by other uids (logging the
// holder's uid and pid), treats one held by its own uid as a live owner, and binds a fresh name
// drawn at random when every candidate is held; clients read SO_PEERCRED of each listener before
// sending a byte, close those of uids they do not allow (ClientOptions.OwnerUIDs), and find a
// fresh name through the kernel's socket diagnostics. A squatter so costs a client a connect and
// a close, never its timeout. Processes of allowed uids are trusted.
//
// # RPC
//
// Frames are u32 length (of what follows), u16 op, u32 request id, payload, little-endian. A
// length is checked against the maximum (MaxFrameBytes after the handshake, 512 bytes before)
// before anything is allocated. A client sends one request at a time and matches replies by id.
// Ops below MinUserOp are this package's; others register with Owner.Handle and are called with
// Client.Call; handler errors travel as a code and a message (internal/proto's codec).
//
// # Bounded resources
//
// What one client can make the owner hold is bounded whatever it sends or fails to read:
// incoming frames beyond a 64 KiB per-connection buffer are charged to
// OwnerOptions.MaxBufferedBytes, shared by all connections, and a frame that finds no room, or
// does not complete within OwnerOptions.FrameTimeout, drops its connection with ErrBusy; every
// reply write has a deadline (OwnerOptions.WriteTimeout); at most
// OwnerOptions.MaxPendingHandshakes connections may be mid-handshake, the oldest evicted first
// (also when accept runs out of descriptors). Frames above 1 MiB are read into an anonymous
// mapping made with unix.Mmap, not mmap-go: mmap-go maps files, and these buffers are handed
// back to the kernel with madvise(MADV_DONTNEED) as soon as the frame is served and kept as
// spare capacity (frame.go).
//
// Both ends use Go's netpoller. A waiting side first polls its socket without parking, yielding
// the CPU between polls, for at most SpinWait (ClientOptions, OwnerOptions; DefaultSpinWait;
// negative turns it off), which saves the cross-process wakeups of back-to-back RPCs at the cost
// of at most SpinWait of CPU per call, and none while idle.
//
// Frames and buffers are zeroed once served: a request may carry a key.
//
// # Secret
//
// The secret is passed explicitly (OwnerOptions.Secret or SecretFile, the same in
// ClientOptions) or comes from SHMSTEER_SECRET_FILE (a file, so it never sits in
// /proc/PID/environ) or SHMSTEER_SECRET; an explicit option wins, and one source given twice is
// ErrSecretConflict. Secret formats as "[redacted]" with every verb, in JSON and in slog, and
// its bytes live in no field that reflection prints. NonDumpable clears the process's dumpable
// flag before the secret is read, so other processes of the uid cannot read its memory or open
// its descriptors (root excepted).
package ipc
