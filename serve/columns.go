package serve

import (
	"sync"
	"time"
)

// columnsWarnEvery is how often, at most, serve repeats the pool-full warning while
// steer.Status.ColumnsFallbacks keeps rising.
const columnsWarnEvery = time.Minute

// columnsWarning is the state of the pool-full warning: the count last warned about, and when.
type columnsWarning struct {
	mu     sync.Mutex
	logged uint64
	at     time.Time
}

// warnColumnsFull logs a warning when the compositions stored in their entries because the
// region's column pool was full (steer.Status.ColumnsFallbacks) rose since the last warning:
// the first rise at once, later ones at most once every columnsWarnEvery. serve calls it after
// each admission and at each persist tick (recompositions for a named vector count too).
func (s *Server) warnColumnsFull(now time.Time) {
	n := s.eng.ColumnsFallbacks()
	w := &s.colWarn
	w.mu.Lock()
	defer w.mu.Unlock()
	if n <= w.logged || (w.logged > 0 && now.Sub(w.at) < columnsWarnEvery) {
		return
	}
	s.log.Warn("column pool full: requests' own vectors are stored in their entries and their decode steps run slower; raise --columns (TOML columns) above the requests with their own vectors in flight at once",
		"columns", s.eng.Region().Stats().Columns, "columns_fallbacks", n, "since_last_warning", n-w.logged)
	w.logged, w.at = n, now
}
