package capture

import "errors"

var (
	// ErrBadSpec: a capture spec is not the JSON its consumer reads (a wrong type, an unknown
	// field, a missing required field, trailing bytes).
	ErrBadSpec = errors.New("shmsteer: bad capture spec")
	// ErrBadConsumer: a consumer name in a request's `capture` object is empty, longer than
	// MaxConsumerName bytes, or has characters outside [a-zA-Z0-9._-].
	ErrBadConsumer = errors.New("shmsteer: bad capture consumer name")
	// ErrBadSlug: a tag or request id is empty, longer than MaxSlugLen characters, contains
	// "..", starts with "/", is ".", or its Slug is longer than a path segment may be (255
	// bytes) (it names a directory under the consumer's root).
	ErrBadSlug = errors.New("shmsteer: capture tag or request id cannot name a directory")
	// ErrUnknownHook: a spec names a hook the model config does not have.
	ErrUnknownHook = errors.New("shmsteer: capture hook not in the model config")
	// ErrLayerRange: a layer (or a range's end) is outside [0, layers), or a range has
	// start > end.
	ErrLayerRange = errors.New("shmsteer: capture layer out of range")
	// ErrEmptySelector: hooks is empty, a hook's selector selects no layer, a dict selector
	// sets neither layers nor ranges, or positions is an empty list.
	ErrEmptySelector = errors.New("shmsteer: capture selector selects nothing")
	// ErrBadPositions: positions is a string other than last_prompt, all_prompt, all_generated
	// or all.
	ErrBadPositions = errors.New("shmsteer: unknown capture positions selector")
	// ErrPositionRange: an explicit position is negative or not inside the prompt, or the
	// prompt length is not positive.
	ErrPositionRange = errors.New("shmsteer: capture position out of range")
	// ErrBadLayout: layout is not per_file or packed.
	ErrBadLayout = errors.New("shmsteer: unknown capture layout")
	// ErrBadRecord: a record given to RequestFiles.Append does not describe its bytes (an
	// unknown dtype, a non-positive shape, data or positions that do not count its rows, a
	// negative layer, a hook name outside [a-zA-Z0-9._-]), or its dtype differs from the
	// request's first record's, or its width from its site's first record's.
	ErrBadRecord = errors.New("shmsteer: bad capture record")
	// ErrFinished: RequestFiles.Append or Finish after Finish, Abort or a failed write.
	ErrFinished = errors.New("shmsteer: capture files already finished")
	// ErrConsumerType: a consumer declaration (NAME=TYPE) names a type this build does not
	// have (filesystem is the one type) or has no "=".
	ErrConsumerType = errors.New("shmsteer: unknown capture consumer type")
	// ErrWrite: the filesystem consumer could not create, write, sync or publish a file (the
	// message names the path and the system's error; check the root's space and permissions).
	ErrWrite = errors.New("shmsteer: capture write failed")
)
