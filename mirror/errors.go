package mirror

import "errors"

var (
	// ErrBadOptions means an Options field is missing or out of range; the message names it.
	ErrBadOptions = errors.New("shmsteer: bad mirror options")
	// ErrQueueFull means a local change could not be queued for publishing because
	// Options.QueueLimit distinct changes already wait (NATS is down or slow): the local write
	// stands, but other hosts will not see it until the entry changes again. Restore the NATS
	// connection, or raise Options.QueueLimit.
	ErrQueueFull = errors.New("shmsteer: mirror queue full: the change was applied locally but will not be mirrored; restore the NATS connection or raise the mirror queue limit")
	// ErrBadEnvelope means a bucket value is not a mirror envelope of this version, or its
	// payload does not decode; it is rejected and counted.
	ErrBadEnvelope = errors.New("shmsteer: bad mirror value")
	// ErrTampered means a bucket value or delete failed authentication: written without this
	// deployment's secret (a bucket writer, a host with another secret), modified, or moved from
	// another entry. It is rejected and counted (Status.Tampered) and changes nothing. If a host
	// of this deployment causes it, give every host the same secret.
	ErrTampered = errors.New("shmsteer: mirrored value failed authentication (not written with this deployment's secret, or modified): give every host the same secret")
	// ErrReplayed means an authenticated value is not newer than the newest value of its origin
	// this host has taken (an old value stored again); it is refused and counted
	// (Status.Replayed). If a host of this deployment causes it, its clock stepped back across a
	// restart: correct the clock.
	ErrReplayed = errors.New("shmsteer: mirrored value is older than what this host holds of its origin (replayed, or the origin's clock stepped back): refused")
	// ErrOldFormat means a bucket value was written by a host running a shmsteer whose mirror
	// values are not authenticated (format 1); it is refused and counted. Upgrade every host.
	ErrOldFormat = errors.New("shmsteer: mirrored value of the old, unauthenticated format 1: upgrade every host's shmsteer")
	// ErrRemoteLimit means a remote value would make what other hosts' entries occupy in this
	// host's region exceed Options.RemoteBytes or Options.RemoteEntries, or its object is larger
	// than it declares; it is refused and counted (Status.Rejected). Raise the limits if the
	// deployment's steering state is that large.
	ErrRemoteLimit = errors.New("shmsteer: mirrored value refused: other hosts' entries would exceed the mirror's remote bound (raise Options.RemoteBytes/RemoteEntries), or its object exceeds its declared size")
	// ErrClosed means the mirror was closed.
	ErrClosed = errors.New("shmsteer: mirror closed")
)
