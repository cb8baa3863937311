package ipc

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"

	"golang.org/x/sys/unix"
)

// Owner and Client print as their namespace and state only. Nothing they hold can print the
// secret anyway (Secret keeps its bytes behind a pointer), but a short, stable description
// is what a log line needs.

func (o *Owner) String() string {
	if o == nil {
		return "ipc.Owner(nil)"
	}
	o.mu.Lock()
	closed := o.closed
	o.mu.Unlock()
	state := "serving"
	if closed {
		state = "closed"
	}
	return fmt.Sprintf("ipc.Owner{namespace: %q, state: %s, clients: %d}", o.ns, state, o.Clients())
}

// GoString is String: %#v shows the same.
func (o *Owner) GoString() string { return o.String() }

// Format prints String for every verb.
func (o *Owner) Format(f fmt.State, _ rune) { io.WriteString(f, o.String()) }

// LogValue logs the namespace and state.
func (o *Owner) LogValue() slog.Value { return slog.StringValue(o.String()) }

// MarshalJSON gives the namespace and state.
func (o *Owner) MarshalJSON() ([]byte, error) { return jsonString(o.String()), nil }

func (c *Client) String() string {
	if c == nil {
		return "ipc.Client(nil)"
	}
	c.mu.Lock()
	state := "attached"
	switch {
	case c.closed:
		state = "closed"
	case c.gone != nil:
		state = "owner gone"
	}
	c.mu.Unlock()
	return fmt.Sprintf("ipc.Client{namespace: %q, state: %s, owner pid: %d}", c.ns, state, c.ownerPID)
}

// GoString is String: %#v shows the same.
func (c *Client) GoString() string { return c.String() }

// Format prints String for every verb.
func (c *Client) Format(f fmt.State, _ rune) { io.WriteString(f, c.String()) }

// LogValue logs the namespace and state.
func (c *Client) LogValue() slog.Value { return slog.StringValue(c.String()) }

// MarshalJSON gives the namespace and state.
func (c *Client) MarshalJSON() ([]byte, error) { return jsonString(c.String()), nil }

func jsonString(s string) []byte {
	b, _ := json.Marshal(s) // a string always marshals
	return b
}

// setNonDumpable clears this process's dumpable flag (see OwnerOptions.NonDumpable).
func setNonDumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("shmsteer: NonDumpable: prctl(PR_SET_DUMPABLE, 0): %w", os.NewSyscallError("prctl", err))
	}
	return nil
}
