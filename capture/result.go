package capture

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Status is a consumer's result for one request.
type Status uint8

const (
	// StatusPending: the request is captured for this consumer and it has not published yet.
	StatusPending Status = 0
	// StatusOK: the consumer published everything.
	StatusOK Status = 1
	// StatusPartialError: the consumer published, but some rows are missing (dropped records,
	// a failed write of some sites).
	StatusPartialError Status = 2
	// StatusError: the consumer failed, left before publishing, or was not attached when the
	// request was admitted.
	StatusError Status = 3
	// StatusNotRequested: the request's capture does not name this consumer.
	StatusNotRequested Status = 4
)

var statusNames = [...]string{"pending", "ok", "partial_error", "error", "not_requested"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// ParseStatus reads a status name (ok, partial_error, error: the ones a consumer publishes).
func ParseStatus(name string) (Status, error) {
	for i, n := range statusNames[StatusOK : StatusError+1] {
		if n == name {
			return Status(i) + StatusOK, nil
		}
	}
	return 0, fmt.Errorf("%w: status %q, want ok, partial_error or error", ErrBadResult, name)
}

// MarshalText writes the status's name.
func (s Status) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

var (
	// ErrBadResult: a result a consumer publishes has a status other than ok, partial_error
	// or error, a payload that is not a JSON array, or a request id that is empty or longer
	// than 65,535 bytes.
	ErrBadResult = errors.New("shmsteer: bad capture result")
	// ErrUnknownConsumer: a consumer attaching names no consumer the owner declares; declare
	// it in the owner's configuration (serve's --capture-consumer NAME=filesystem).
	ErrUnknownConsumer = errors.New("shmsteer: capture consumer not declared by the owner")
	// ErrConsumerTaken: a consumer of that name is attached already; stop it first, or give
	// this one another declared name.
	ErrConsumerTaken = errors.New("shmsteer: a capture consumer of that name is attached already")
	// ErrNoHub: the owner does not serve capture (no consumer declared, or no hub); start it
	// with a capture consumer declared.
	ErrNoHub = errors.New("shmsteer: the owner does not serve capture")
	// ErrHubProtocol: a message on a capture connection does not parse (a length, type or
	// field out of range); the connection is closed.
	ErrHubProtocol = errors.New("shmsteer: bad capture connection message")
	// ErrHubGone: the owner's hub closed the capture connection (the owner exited, or dropped
	// this consumer for not reading its notices); attach again.
	ErrHubGone = errors.New("shmsteer: the owner's capture hub is gone")
)

// Result is one consumer's result for one request, as Hub.Result and serve's
// GET /v1/requests/{id}/capture give it: {"status", "error", "payload"}, and "global": true
// when the consumer's global spec captured the request (it did not name the consumer).
type Result struct {
	Status  Status
	Error   string          // empty: none (JSON null)
	Payload json.RawMessage // a JSON array (the filesystem consumer: the paths it wrote); nil: []
	Global  bool            // the consumer's global spec applied (steer.AdmittedCapture.Global)
}

// MarshalJSON writes {"status": name, "error": message or null, "payload": [...]}, and
// "global": true for a global spec's result.
func (r Result) MarshalJSON() ([]byte, error) {
	var e *string
	if r.Error != "" {
		e = &r.Error
	}
	p := r.Payload
	if len(p) == 0 {
		p = json.RawMessage("[]")
	}
	return json.Marshal(struct {
		Status  Status          `json:"status"`
		Error   *string         `json:"error"`
		Payload json.RawMessage `json:"payload"`
		Global  bool            `json:"global,omitempty"`
	}{r.Status, e, p, r.Global})
}

// checkPayload reports whether p is a JSON array (or empty).
func checkPayload(p []byte) error {
	if len(p) == 0 {
		return nil
	}
	var a []json.RawMessage
	if err := json.Unmarshal(p, &a); err != nil {
		return fmt.Errorf("%w: payload is not a JSON array: %v", ErrBadResult, err)
	}
	return nil
}
