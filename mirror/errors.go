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
	// ErrTampered means a sealed key value failed authentication (modified, moved to another
	// entry, or sealed with another secret); it is rejected and counted.
	ErrTampered = errors.New("shmsteer: mirrored key failed authentication (tampered, or another secret)")
	// ErrClosed means the mirror was closed.
	ErrClosed = errors.New("shmsteer: mirror closed")
)
