package proto_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/shmsteer/shmsteer/internal/proto"

	// Every package that binds wire codes (a wire_gen.go): the process links them all, as an
	// owner running serve does.
	_ "github.com/shmsteer/shmsteer/capture"
	_ "github.com/shmsteer/shmsteer/ipc"
	_ "github.com/shmsteer/shmsteer/keys"
	_ "github.com/shmsteer/shmsteer/serve"
	_ "github.com/shmsteer/shmsteer/steer"
)

// TestWireCodes: in a process that links every binding package, each code of codes_gen.go is
// bound, decodes to an error that matches its sentinel, and is what an error wrapping that
// sentinel encodes as: no code lacks its package's binding (a wire line generated into
// codes_gen.go but not bound) and none is shadowed by an earlier sentinel of its package or by
// a later package's that it wraps.
func TestWireCodes(t *testing.T) {
	names := proto.WireNames()
	if len(names) < 40 {
		t.Fatalf("only %d wire codes: codes_gen.go is not errors.tab's", len(names))
	}
	for code, name := range names {
		s := proto.Sentinel(code)
		if s == nil {
			t.Errorf("code %d (%s) is bound by no package: go generate ./capi", code, name)
			continue
		}
		if got := proto.CodeOf(fmt.Errorf("context: %w", s)); got != code {
			t.Errorf("an error wrapping %s encodes as %d (%s), not its code %d: put the sentinel it wraps after it", name, got, names[got], code)
		}
		if d := proto.Decode(code, "the owner's message"); !errors.Is(d, s) || d.Error() != "the owner's message" {
			t.Errorf("code %d decodes to %v", code, d)
		}
	}
}
