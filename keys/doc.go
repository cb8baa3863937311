// Package keys owns the per-request key registry: request id → secret key, stored in the
// region every shmsteer process maps (the replacement for the seed's shared dict), with its
// revocation sentinels, their purge after a grace period, the bound on one key, the RPC ops
// that carry a worker's writes to the owner (internal/proto's table) and the change hook a
// mirror subscribes to (Owner.OnChange).
//
// It sits above the transport: it reads the region through package shm's exported API and
// reaches the owner through package ipc's generic RPC (ipc.Owner.Handle, ipc.Client.Call); ipc
// knows nothing of keys. It must not touch the region's layout (shm owns it), the attach
// handshake or the secret (ipc owns them), nor steering. A key never appears in a log, an
// error or a panic; frames and buffers that held keys are zeroed.
//
// To start: the owner calls Open once, right after ipc.NewOwner and before workers attach (the
// registry lives until the owner closes): an *Owner; each worker calls Attach with its
// ipc.Client (or with each client an ipc.Follower hands out): a *Worker. Both embed a
// *Registry, the side both share: Get, Set, Remove, Count, Range, MaxKeyBytes, and NewReader
// (a worker's step loop reads through a Reader of its own). The owner's own operations
// (OnChange, RevokedInArena, RevokedWithoutSentinel) are methods of Owner only, so a worker
// cannot call them; code that serves either side takes the *Registry.
//
// # Entries
//
// A key is stored under Kind, keyed by request id: the key bytes and one state byte. Remove
// deletes the value and marks the id in one transaction (shm's mark table, so a revocation
// always fits; past a full table the sentinel is an arena entry, the state byte alone); Get
// then returns ErrRevoked until the owner lifts the mark after Options.Grace. An empty key is
// a key, not a revocation. Setting an id again cancels its pending purge.
//
// # Writes
//
// In the owner, Set and Remove write the region under the registry's lock and are announced
// to OnChange's observers, whichever process asked for them; Origin tags a write (a mirror's,
// so it is not published back) and If makes it conditional. In a worker each write is one RPC;
// Attach learns the owner's MaxKeyBytes, so an oversize Set is refused with ErrTooLarge there.
package keys
