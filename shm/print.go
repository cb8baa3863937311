package shm

import "fmt"

// Region, Reader and Snapshot print as their identity only, by every fmt verb: their fields
// reach the mapping, which holds every value (the key registry's keys among them), and fmt
// would print it byte by byte. (Copying a Region or Reader by value is not allowed anyway.)

// Format prints the region's id and role.
func (r *Region) Format(f fmt.State, _ rune) {
	if r == nil {
		fmt.Fprint(f, "shm.Region(nil)")
		return
	}
	fmt.Fprintf(f, "shm.Region{id: %#x, owner: %v, closed: %v}", r.l.regionID, r.IsOwner(), r.closed.Load())
}

// Format prints the reader's slot.
func (rd *Reader) Format(f fmt.State, _ rune) {
	if rd == nil {
		fmt.Fprint(f, "shm.Reader(nil)")
		return
	}
	fmt.Fprintf(f, "shm.Reader{slot: %d, open: %v}", rd.slot/lineSize-1, rd.r != nil)
}

// Format prints the snapshot's version.
func (s Snapshot) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "shm.Snapshot{version: %d, open: %v}", s.version, s.r != nil)
}
