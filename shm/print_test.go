//go:build linux

package shm

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPrintingRevealsNoValue: the mapping holds every value (keys among them); printing a
// Region, a Reader or a Snapshot, by any verb or as JSON, must show none of it.
func TestPrintingRevealsNoValue(t *testing.T) {
	r := newTestRegion(t, Config{IndexSlots: 256, ArenaBytes: 1 << 20})
	const secret = "KEY-BYTES-4f7c1e"
	_, err := r.Put(testKind, "req", []byte(secret))
	require.NoError(t, err)
	rd, err := r.NewReader()
	require.NoError(t, err)
	defer rd.Close()
	s, err := r.Snapshot()
	require.NoError(t, err)
	defer s.Close()
	type holder struct {
		region *Region
		snap   Snapshot
		rd     *Reader
	}
	for _, v := range []any{r, rd, s, &s, holder{r, s, rd}, &holder{r, s, rd}, []*Region{r}, map[string]*Region{"r": r}} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%q"} {
			out := fmt.Sprintf(verb, v)
			// Bytes may print in any encoding (fmt writes a []byte field as decimal numbers):
			// a print that reached the mapping would be megabytes long.
			require.Less(t, len(out), 4096, "%s of %T", verb, v)
			require.NotContains(t, out, secret, "%s of %T", verb, v)
			require.NotContains(t, out, fmt.Sprintf("%x", secret), "%s of %T", verb, v)
		}
		b, _ := json.Marshal(v)
		require.False(t, strings.Contains(string(b), secret), "json of %T", v)
	}
}
