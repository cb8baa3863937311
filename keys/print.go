package keys

import (
	"fmt"
	"io"
	"log/slog"
)

// Registry's methods take a value, so a copied Registry prints the same (fmt would otherwise
// follow its *shm.Region with %s and print the mapping). It prints what it belongs to, never a
// key.

func (k Registry) String() string {
	if k.w == nil {
		return "keys.Registry{}"
	}
	return "keys.Registry{in " + k.w.String() + "}"
}

// GoString is String: %#v shows the same.
func (k Registry) GoString() string { return k.String() }

// Format prints String for every verb.
func (k Registry) Format(f fmt.State, _ rune) { io.WriteString(f, k.String()) }

// LogValue logs what the registry belongs to.
func (k Registry) LogValue() slog.Value { return slog.StringValue(k.String()) }
