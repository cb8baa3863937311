// Package mirror mirrors one host's steering state (named vectors, the global tiers and,
// when asked, the key registry) to the other hosts of a deployment through a NATS JetStream
// key-value bucket, and applies theirs to the local region.
//
// # What it owns
//
// The bucket (default "shmsteer", history 1, file storage) and its entries, the object store
// "<bucket>-blobs" that holds steering sets too large for one NATS message, the envelope,
// authentication and sealing format of every value, and the outgoing queue. Files: mirror.go
// (options, start, status, the queue), publish.go, apply.go (admitting and applying remote
// values), fetch.go (the object store), purge.go (revoked keys' and dropped conversations' tombstones), envelope.go and
// keys.go. Replication itself is JetStream's:
// every host Puts its changes into the bucket and watches the bucket (an ordered consumer);
// the bucket's revision (its stream sequence) totally orders all writes of all hosts, so a
// host applies an entry only if its revision is newer than what it holds for that entry
// (ties, which one bucket cannot produce, go to the larger host id), and every host ends
// with the value of each entry's last revision. There is no protocol of our own on the wire.
//
// # Trust
//
// Anyone who can write the bucket is assumed hostile unless they hold the deployment's
// secret (Options.Secret, required). Every value ends with an HMAC-SHA256 tag under a key
// derived from the secret over the entry name, the envelope (its origin host included) and the
// payload; a value or delete without a valid tag (a bucket writer, a host with another secret,
// a plain KV delete or purge, a value moved to another entry) is refused, counted
// (Status.Tampered, ErrTampered) and changes nothing, and no memory is kept of it. Values of
// the old, unauthenticated format 1 (shmsteer before this format) are refused and counted too
// (Status.Rejected, ErrOldFormat): every host of a deployment must run this format.
//
// Freshness: each value carries its origin's seq, a clock that increases over every value the
// host publishes and across its restarts (at least the wall clock in nanoseconds; publishing
// waits for the first resync, which also shows the host its own earlier values). A host
// refuses a value whose seq is not above the newest of that origin's it has taken, unless it
// is a value it had already (a resync delivers those again): an old value stored again (a
// replayed sealed key after its revocation, an old vector) is refused and counted
// (Status.Replayed, ErrReplayed), also after the entry was purged and forgotten. The host that
// wrote the entry's newest value then stores it again (a purge marker for a revoked key), so a
// host that joins later, which has no memory to tell a replay by, finds the newest value. A
// host whose clock steps back across a restart by more than the restart takes has its values
// refused as replays until its clock passes its old values.
//
// What other hosts may occupy is bounded: remote values may hold at most Options.RemoteBytes
// (default half the arena) in at most Options.RemoteEntries entries (default half the index);
// beyond, they are refused and counted (ErrRemoteLimit), and local writes are not affected. An
// object reference is checked before anything is fetched (declared size within the bound, the
// object store's record of the same size, not a link), read at most Options.FetchRate bytes a
// second, never past its declared size, and compared with the reference's sha256. Refusals are
// logged at most once a second. A bucket writer can still destroy what the bucket holds
// (delete it): hosts keep what they applied, and hosts that join then find nothing.
//
// # Entries
//
//	v.<base64url(name)>   a named vector: its metadata when it has any (steer.VectorMeta, the
//	                      model hint: steer.DecodeVectorMeta; a value without it, as every
//	                      host wrote before hints were mirrored, is a vector without a hint),
//	                      then the steering wire format (steer.DecodeSteering)
//	p.<base64url(name)>   a probe vector (steer.KindProbe, kind "probe"), same format
//	g                     the global tiers, same format
//	c.<base64url(tenant NUL id)>  a conversation's rest_of_conversation gates with their
//	                      engaged state (steer.Owner.GateConversation's encoding), applied
//	                      with RestoreGateConversation under the latch map's caps; an entry
//	                      evicted by its host is deleted, its tombstone purged as a key's
//	                      is (KeyPurgeAfter). Bucket readers see conversation ids
//	                      and tenants, as they see vector names.
//	k.<base64url(mac)>    a key: mac = HMAC-SHA256 of the request id under a key derived from
//	                      the secret; the value is sealed (ChaCha20-Poly1305, key from
//	                      ipc.Secret.DeriveKey, HKDF-SHA256): NATS and bucket readers see
//	                      neither the id nor the key. A value that fails to open is rejected
//	                      and counted (Status.Tampered).
//
// # Large sets
//
// A steering set larger than the server's max payload (1 MiB by default; 80 entries of a
// 4096-wide model already exceed it) is stored in the JetStream object store, and its bucket
// entry holds a reference (object name, size, sha256). The object store is JetStream's own
// chunking (128 KiB chunks, digest-checked on read), so no chunk protocol of ours exists; the
// entry stays one small message, so ordering stays the bucket's revision order and an entry is
// never seen half-written. The object is written before the reference, is named by entry and
// content digest (never rewritten), and is deleted by its host once the entry has a newer value
// (a host still fetching it then skips it: a newer value exists).
//
// Every value starts with an envelope (envelope.go): the writing host's id and incarnation,
// its seq (see Trust) and flags (deleted, sealed, stored in the object store, purge marker),
// and ends with its tag. Deletions are values with the deleted flag, so they carry their
// origin too. A revoked key's tombstone is purged by its host after Options.KeyPurgeAfter with
// a KV purge whose marker carries an authenticated envelope (the marker removed after as long
// again), so the bucket does not grow with every request served; a host that was away from
// NATS for at least KeyPurgeAfter finds the entry gone in its resync and revokes the key. A
// dropped or evicted conversation's tombstone is purged the same way; a host away as long drops
// another host's conversation whose entry it finds gone. An
// entry gone from the bucket while a host was away for less was removed by someone without
// the secret: counted (Status.Tampered), the key stays.
//
// # Local first
//
// Reads and writes of the local region never wait for NATS. The owner's writes reach the
// mirror through steer.Owner.OnChange (key writes through keys.Owner.OnChange, whoever made them); the mirror queues the
// entry's name, coalescing repeats, and a publisher reads the newest value from the region when
// it sends. The queue is bounded (Options.QueueLimit entries): when it is full a change is not
// mirrored, ErrQueueFull is logged and counted (Status.QueueFull), and the local write stands.
// Changes the mirror applies from the bucket are written with steer's origin tag
// (Register, Unregister and SetGlobal with steer.Origin and steer.If) and straight to the keys.Owner, so they are
// never published back.
//
// # What it must not touch
//
// The region only through package steer's and ipc's APIs; no region layout, no unsafe. It never
// logs, returns or publishes the secret or a key in clear. It does not start NATS.
package mirror
