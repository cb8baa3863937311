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

// TestValidateColumns: Validate refuses a columns setting over what the model's column pool
// holds (steer.MaxColumns: ErrConfig saying to lower --columns), the default 256 included,
// and accepts the most, 0 and a negative value (no pool) alike.
func TestValidateColumns(t *testing.T) {
	c := DefaultConfig()
	c.Namespace, c.Hidden, c.Layers = "cols", 4096, 32
	most := steer.MaxColumns(c.Model())
	require.Equal(t, 26214, most, "hidden 4096, 32 layers, 5 hooks: 2.5 MiB a column in a 64 GiB pool")
	for _, n := range []int{most, 1, 0, -1} {
		c.Columns = n
		require.NoError(t, c.Validate(), "columns %d", n)
	}
	c.Columns = most + 1
	err := c.Validate()
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, fmt.Sprintf("columns %d: the region's column pool holds at most %d columns for this model", most+1, most))
	require.ErrorContains(t, err, "lower --columns")
	rc, err := steer.RegionConfig(c.Model(), shm.Config{Columns: most + 1})
	require.NoError(t, err)
	_, err = shm.Create(rc)
	require.ErrorIs(t, err, shm.ErrBadConfig, "the same limit as shm's")

	c.Hidden, c.Layers, c.Columns = 16384, 160, 0 // a column of 50 MiB: 1310 fit, the default 256 does
	require.NoError(t, c.Validate())
	c.Layers = 1024 // 320 MiB a column: 204 fit, not the default
	require.Less(t, steer.MaxColumns(c.Model()), steer.DefaultColumns)
	require.ErrorContains(t, c.Validate(), "columns 256:")
}
