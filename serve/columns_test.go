package serve

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// TestWarnColumnsFull: serve warns when steer's ColumnsFallbacks first rises, then at most
// once a minute while it keeps rising, and never while it stands still; the warning says to
// raise --columns.
func TestWarnColumnsFull(t *testing.T) {
	model := steer.ModelConfig{Hidden: 8, Layers: 2}
	rc, err := steer.RegionConfig(model, shm.Config{IndexSlots: 256, ArenaBytes: 4 << 20, ReaderSlots: 8, Columns: 1})
	require.NoError(t, err)
	r, err := shm.Create(rc)
	require.NoError(t, err)
	defer r.Close()
	eng, err := steer.Open(r, &model, steer.Options{Logf: t.Logf})
	require.NoError(t, err)
	var logs bytes.Buffer
	s := &Server{eng: eng, log: slog.New(slog.NewTextHandler(&logs, nil))}
	n := 0
	admit := func() {
		t.Helper()
		v := make([]float32, model.Hidden)
		v[n%8] = 1
		_, err := eng.Admit(steer.Admission{RequestID: fmt.Sprint("r", n), Override: &steer.Steering{Base: steer.Tier{Vectors: []steer.Vector{{Hook: "pre_attn", Layer: 0, Scale: 1, Data: v}}}}})
		require.NoError(t, err)
		n++
	}
	warnings := func() int { return strings.Count(logs.String(), "column pool full") }
	t0 := time.Now()
	admit() // takes the one column
	s.warnColumnsFull(t0)
	require.Zero(t, warnings(), "the pool had room")
	admit() // in its entry
	s.warnColumnsFull(t0)
	require.Equal(t, 1, warnings(), "the first rise warns at once")
	require.Contains(t, logs.String(), "raise --columns")
	require.Contains(t, logs.String(), "columns_fallbacks=1")
	s.warnColumnsFull(t0.Add(2 * time.Minute))
	require.Equal(t, 1, warnings(), "no rise, no warning")
	admit()
	s.warnColumnsFull(t0.Add(30 * time.Second))
	require.Equal(t, 1, warnings(), "a rise within a minute of the last warning waits")
	s.warnColumnsFull(t0.Add(61 * time.Second))
	require.Equal(t, 2, warnings(), "a minute after, the rise warns")
	require.Contains(t, logs.String(), "columns_fallbacks=2")
	admit()
	s.warnColumnsFull(t0.Add(90 * time.Second))
	require.Equal(t, 2, warnings())
	require.EqualValues(t, 3, eng.ColumnsFallbacks())
}
