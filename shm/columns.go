package shm

import (
	"fmt"
	"math/bits"
)

// The column pool: Config.Columns columns of Config.ColumnCells cells of Config.CellBytes bytes,
// an area of the data memfd after the arena, cell-major (cell c of column k at
// (c*columns + k)*cellBytes, so cell c of adjacent columns is adjacent). The owner reserves a
// column in a Tx (AllocColumn), writes its cells in place (Tx.Cell) and ties it to a value of
// the same Tx (Attach); the column then lives exactly as long as that value's blob: retired
// at the version that replaces or deletes it and reused once every pin has passed that version,
// the blob rule. Which column is whose lives in the owner's private memory (columns), as the
// arena's allocator does; the mapping holds only the cells' bytes.
//
// A freed column keeps its bytes: it is zeroed when it is reused, and only where its earlier
// values wrote (a bitset per column), so neither a reclamation pass nor an unused cell costs a
// write: Tx.Cell zeroes a stale cell as it hands it out, and the commit that attaches the
// column zeroes the stale cells this transaction did not ask for.

// columnPool is the validated geometry of a region's pool and its bytes (nil: no pool).
type columnPool struct {
	bytes                     []byte
	columns, cells, cellBytes uint64
}

// cell is the bytes of cell cell of column col, both in range.
func (p *columnPool) cell(col, cell uint64) []byte {
	off := (cell*p.columns + col) * p.cellBytes
	return p.bytes[off : off+p.cellBytes : off+p.cellBytes]
}

// ColumnPool is a region's column pool as every process sees it: a small value, valid while
// its Region is open (its cells are views of the mapping; Region.Close unmaps them). Its
// methods are safe for concurrent use, take no lock and allocate nothing.
//
// What a reader may read is decided by the values it reads: a column named by a value that is
// visible at the version a reader has pinned (a Snapshot, or a Reader's read) is neither
// rewritten nor zeroed while that pin holds; columns named by no such value may be reused by
// the owner at any moment, so their bytes mean nothing to that reader.
type ColumnPool struct{ p *columnPool }

// Columns returns the region's column pool; a region created without one returns a pool whose
// Geometry is zero and whose Cell is always nil. In readers the cells are the read-only
// mapping; the owner writes cells through Tx.Cell only, never through these views. After
// Close it returns the empty pool (and a pool taken before must not be used after Close).
func (r *Region) Columns() ColumnPool {
	if r.closed.Load() {
		return ColumnPool{}
	}
	return ColumnPool{&r.pool}
}

// Geometry returns the number of columns, the cells of each and each cell's bytes (zeros: no
// pool).
func (c ColumnPool) Geometry() (columns, cells, cellBytes int) {
	if c.p == nil {
		return 0, 0, 0
	}
	return int(c.p.columns), int(c.p.cells), int(c.p.cellBytes)
}

// Cell returns the bytes of cell cell of column col (exactly cellBytes, 64-byte aligned), or
// nil if either is out of range. Read it only as the rule on ColumnPool allows.
func (c ColumnPool) Cell(col, cell int) []byte {
	p := c.p
	if p == nil || uint64(col) >= p.columns || uint64(cell) >= p.cells {
		return nil
	}
	return p.cell(uint64(col), uint64(cell))
}

// CellFloat32 is Cell viewed as cellBytes/4 float32s (as AsFloat32 views it), or nil if out of
// range.
func (c ColumnPool) CellFloat32(col, cell int) []float32 {
	p := c.p
	if p == nil || uint64(col) >= p.columns || uint64(cell) >= p.cells {
		return nil
	}
	return cellFloats(p.cell(uint64(col), uint64(cell)))
}

// CellsFloat32 is cell cell of the n adjacent columns col, col+1, ..., col+n-1 viewed as one
// run of n*cellBytes/4 float32s (the pool is cell-major, so they lie side by side), or nil if
// n < 1 or any of them is out of range. Read it only as the rule on ColumnPool allows, for
// every column of the run.
func (c ColumnPool) CellsFloat32(col, n, cell int) []float32 {
	p := c.p
	if p == nil || n < 1 || uint64(col) >= p.columns || uint64(n) > p.columns-uint64(col) || uint64(cell) >= p.cells {
		return nil
	}
	off := (uint64(cell)*p.columns + uint64(col)) * p.cellBytes
	end := off + uint64(n)*p.cellBytes
	return cellFloats(p.bytes[off:end:end])
}

// Format prints the pool's geometry only: its cells are the mapping's bytes.
func (c ColumnPool) Format(f fmt.State, _ rune) {
	cols, cells, cb := c.Geometry()
	fmt.Fprintf(f, "shm.ColumnPool{columns: %d, cells: %d, cellBytes: %d}", cols, cells, cb)
}

// A column's state, in the owner's private memory.
const (
	colFree     = iota // free to reserve; its dirty cells hold earlier values' bytes
	colReserved        // reserved by the Tx in progress, not attached
	colPending         // reserved by the Tx in progress and attached to one of its writes
	colLive            // attached to a published value (columns.byBlob holds it)
	colRetired         // its value was replaced or deleted; waits in columns.retired
)

// columns is the owner's private bookkeeping of the pool.
type columns struct {
	state []uint8
	free  []uint64 // bitset of colFree columns: AllocColumn takes the lowest, keeping live columns dense
	nfree int
	// dirty[k] is a bitset of the cells of column k that may be non-zero (nil: none), so reuse
	// zeroes those cells only and faults in nothing else. handed[k] is the cells that Tx.Cell
	// handed out in the transaction in progress (zeroed first if dirty), reset when it ends.
	dirty, handed [][]uint64
	// populated is a bitset over (cell, group of colGroup adjacent columns): whether Tx.Cell
	// has faulted that cell of the group's columns in (populate), all at once.
	populated []uint64
	// byBlob maps the arena offset of a published value's blob to the columns attached to it.
	byBlob  map[uint64][]int
	retired []retiredCol // in retire-version order
}

// colGroup is how many adjacent columns' cells Tx.Cell faults in together, the first time it
// hands out that cell of any of them. A step reads one cell of many adjacent columns in a run;
// faulted in as requests come, one at a time, those cells' pages lie scattered in physical
// memory, and faulted in together, side by side. The cost: the group's other cells at that
// index are resident before they are written, at most colGroup-1 cells per cell written.
const colGroup = 8

// colGroups is the number of column groups of a pool of n columns.
func colGroups(n uint64) uint64 { return (n + colGroup - 1) / colGroup }

type retiredCol struct {
	col     int
	version uint64
}

func newColumns(l layout) *columns {
	n := int(l.columns)
	c := &columns{state: make([]uint8, n), free: make([]uint64, (n+63)/64), nfree: n, dirty: make([][]uint64, n), handed: make([][]uint64, n), byBlob: map[uint64][]int{}}
	c.populated = make([]uint64, (l.columnCells*colGroups(l.columns)+63)/64)
	for k := 0; k < n; k++ {
		c.free[k/64] |= 1 << (k % 64)
	}
	return c
}

// take reserves the lowest free column, or reports false.
func (c *columns) take() (int, bool) {
	for i, w := range c.free {
		if w != 0 {
			b := bits.TrailingZeros64(w)
			c.free[i] &^= 1 << b
			c.nfree--
			k := i*64 + b
			c.state[k] = colReserved
			return k, true
		}
	}
	return 0, false
}

// releaseColumn makes column k free; its bytes stay (dirty) until it is reused.
func (r *Region) releaseColumn(k int) {
	c := r.w.cols
	clear(c.handed[k])
	c.state[k] = colFree
	c.free[k/64] |= 1 << (k % 64)
	c.nfree++
}

// AllocColumn reserves a free column for this transaction and returns its number. Write its
// cells with Cell and tie it to a value of this transaction with Attach; a column still
// unattached when the transaction commits is freed at once (no published value may name it),
// and an aborted transaction frees all it reserved. A reserved column reads zero wherever this
// transaction did not write it: Cell hands out zeroed bytes, and the commit that attaches the
// column zeroes what an earlier value left in the cells this transaction did not ask for, so
// readers see zero there. With no column free it runs a reclamation pass if some column is
// retired (as a full arena does; with none retired a pass could free nothing), and then answers
// ErrColumnsFull; a region without a pool answers ErrColumnsFull as well.
func (tx *Tx) AllocColumn() (int, error) {
	r := tx.r
	c := r.w.cols
	if c == nil {
		return 0, fmt.Errorf("%w: this region has no column pool; create it with Config.Columns, ColumnCells and CellBytes", ErrColumnsFull)
	}
	k, ok := c.take()
	if !ok && len(c.retired) > 0 { // a pass frees retired columns only: with none, it cannot help
		r.reclaimLocked()
		k, ok = c.take()
	}
	if !ok {
		return 0, r.columnsFull(tx)
	}
	tx.cols = append(tx.cols, k)
	return k, nil
}

// columnsFull is the ErrColumnsFull of an AllocColumn that found no column free after a
// reclamation pass: how the columns are taken, what holds the retired ones, and what to do.
func (r *Region) columnsFull(tx *Tx) error {
	w := r.w
	c := w.cols
	msg := fmt.Sprintf("all %d columns taken (%d by published values, %d retired, %d reserved by this transaction)",
		len(c.state), len(c.state)-len(c.retired)-len(tx.cols), len(c.retired), len(tx.cols))
	if len(c.retired) > 0 && w.lastBound.Version != 0 {
		return fmt.Errorf("%w: %s; the retired columns wait for %v: that process is stuck or holds a snapshot open; end it (its slots are freed within a second) or close its snapshot",
			ErrColumnsFull, msg, w.lastBound)
	}
	return fmt.Errorf("%w: %s; delete the values that hold columns (end requests) or raise Config.Columns", ErrColumnsFull, msg)
}

// Cell returns the writable bytes of cell cell of column col (exactly CellBytes, capacity
// capped, 64-byte aligned), a column this transaction reserved: the bytes are the mapping
// itself, as PutFunc's are. Readers see them once the transaction commits with the column
// attached. ErrBadColumn for a column this transaction did not reserve or a cell out of range.
func (tx *Tx) Cell(col, cell int) ([]byte, error) {
	r := tx.r
	if err := tx.reserved(col); err != nil {
		return nil, err
	}
	p := &r.pool
	if uint64(cell) >= p.cells {
		return nil, fmt.Errorf("%w: cell %d of column %d: a column has %d cells", ErrBadColumn, cell, col, p.cells)
	}
	c := r.w.cols
	if c.handed[col] == nil {
		c.handed[col] = make([]uint64, (p.cells+63)/64)
	}
	if c.dirty[col] == nil {
		c.dirty[col] = make([]uint64, (p.cells+63)/64)
	}
	dst := p.cell(uint64(col), uint64(cell))
	if g := uint64(cell)*colGroups(p.columns) + uint64(col)/colGroup; c.populated[g/64]&(1<<(g%64)) == 0 {
		first := uint64(col) / colGroup * colGroup
		last := min(first+colGroup, p.columns)
		populate(p.bytes, (uint64(cell)*p.columns+first)*p.cellBytes, (uint64(cell)*p.columns+last)*p.cellBytes)
		c.populated[g/64] |= 1 << (g % 64)
	}
	i, bit := cell/64, uint64(1)<<(cell%64)
	if c.handed[col][i]&bit == 0 {
		if c.dirty[col][i]&bit != 0 {
			zero(dst) // an earlier value's bytes
		}
		c.handed[col][i] |= bit
		c.dirty[col][i] |= bit
	}
	return dst, nil
}

// reserved checks that col is a column this transaction reserved.
func (tx *Tx) reserved(col int) error {
	c := tx.r.w.cols
	switch {
	case c == nil:
		return fmt.Errorf("%w: column %d: this region has no column pool", ErrBadColumn, col)
	case col < 0 || col >= len(c.state):
		return fmt.Errorf("%w: column %d out of range [0, %d)", ErrBadColumn, col, len(c.state))
	case tx.done || (c.state[col] != colReserved && c.state[col] != colPending):
		return fmt.Errorf("%w: column %d was not reserved by this transaction (AllocColumn it first, in the same Update)", ErrBadColumn, col)
	}
	return nil
}

// Attach ties columns this transaction reserved to the value it wrote under (kind, key) (with
// Put, PutFunc or PutFloat32, earlier in the same transaction). From the commit on, the columns
// live exactly as long as that value: when a later transaction replaces or deletes it, they
// are retired at the same version as its blob and reused once no reader pins a version below
// that one (zeroed on reuse where they were written). A later write of the same key in this
// transaction detaches them again (they are still reserved: attach them to the new value, or
// they are freed at commit). ErrBadColumn, and nothing changes, if the value was not written in
// this transaction, or a column was not reserved by it or is already attached.
func (tx *Tx) Attach(kind Kind, key string, cols ...int) error {
	var op *txOp
	for i := range tx.ops {
		if o := &tx.ops[i]; o.kind == kind && o.key == key && !o.isDelete {
			op = o
			break
		}
	}
	if op == nil {
		return fmt.Errorf("%w: no value was written under kind %d key of %d bytes in this transaction; Put it before Attach", ErrBadColumn, kind, len(key))
	}
	c := tx.r.w.cols
	for i, k := range cols {
		if err := tx.reserved(k); err != nil {
			return err
		}
		if c.state[k] == colPending {
			return fmt.Errorf("%w: column %d is already attached to a value of this transaction", ErrBadColumn, k)
		}
		for _, j := range cols[:i] {
			if j == k {
				return fmt.Errorf("%w: column %d named twice", ErrBadColumn, k)
			}
		}
	}
	for _, k := range cols {
		c.state[k] = colPending
	}
	op.cols = append(op.cols, cols...)
	return nil
}

// detach returns the columns attached to op (a write of this transaction that is being
// replaced or dropped) to the reserved state.
func (tx *Tx) detach(op *txOp) {
	if len(op.cols) == 0 {
		return
	}
	c := tx.r.w.cols
	for _, k := range op.cols {
		c.state[k] = colReserved
	}
	op.cols = nil
}

// abortColumns frees every column the transaction reserved.
func (tx *Tx) abortColumns() {
	for _, k := range tx.cols {
		tx.r.releaseColumn(k)
	}
	tx.cols = nil
}

// commitColumns runs at commit for each op: the columns of the value it replaces (a blob
// retired at v) are retired at v, and the columns attached to its new value go live, zeroed
// where this transaction did not write them.
func (r *Region) commitColumns(op *txOp, v uint64) {
	c := r.w.cols
	if c == nil {
		return
	}
	if op.hadOld {
		if old, ok := c.byBlob[op.oldBlob.off]; ok {
			delete(c.byBlob, op.oldBlob.off)
			for _, k := range old {
				c.state[k] = colRetired
				c.retired = append(c.retired, retiredCol{col: k, version: v})
			}
		}
	}
	if len(op.cols) > 0 {
		for _, k := range op.cols {
			c.state[k] = colLive
			r.settleColumn(k)
		}
		c.byBlob[op.off] = op.cols
	}
}

// settleColumn zeroes the cells of column k that an earlier value left and this transaction
// did not hand out, so that what the column holds is exactly what this transaction wrote.
func (r *Region) settleColumn(k int) {
	c, p := r.w.cols, &r.pool
	for i, d := range c.dirty[k] {
		var h uint64
		if c.handed[k] != nil {
			h = c.handed[k][i]
		}
		for stale := d &^ h; stale != 0; stale &= stale - 1 {
			zero(p.cell(uint64(k), uint64(i*64+bits.TrailingZeros64(stale))))
		}
		c.dirty[k][i] = h
	}
	clear(c.handed[k])
}

// endColumns frees, at commit, the columns the transaction reserved and did not attach, and
// publishes the pool's counts.
func (r *Region) endColumns(tx *Tx) {
	c := r.w.cols
	if c == nil {
		return
	}
	for _, k := range tx.cols {
		if c.state[k] == colReserved {
			r.releaseColumn(k)
		}
	}
	tx.cols = nil
	r.publishColumns()
}

// reclaimColumns frees the retired columns whose version every pin has passed (bound).
func (r *Region) reclaimColumns(bound uint64) {
	c := r.w.cols
	if c == nil {
		return
	}
	n := 0
	for _, rc := range c.retired {
		if rc.version > bound {
			break
		}
		r.releaseColumn(rc.col)
		n++
	}
	if n > 0 {
		c.retired = append(c.retired[:0], c.retired[n:]...)
		r.publishColumns()
	}
}

func (r *Region) publishColumns() {
	c := r.w.cols
	store64(r.data, hColumnsUsed, uint64(len(c.state)-c.nfree))
	store64(r.data, hColumnsRetired, uint64(len(c.retired)))
}
