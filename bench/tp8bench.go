package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
	"golang.org/x/sys/unix"
)

// mem.tp8_ratio with real ranks: an owner holds the bench's 1024 keys and 16 named steering
// sets of 8 layers × 2 hooks × D = 4096 (4 MiB of vectors, the mem.overhead_ratio workload),
// and 16 requests each steered by one set. 8 rank processes attach like workers; each reads
// every key and every vector entry in the region, then applies the steering of all 16 requests
// at every (hook, layer) through a Stepper, as a rank of a tensor-parallel group would.
//
// The bytes the 8 ranks hold = the region's resident pages (its memfds' st_blocks, counted once
// however many processes map them) + each rank's private growth: the increase, from just after
// attaching (and settling, see settleRuntime) to just after reading and stepping, of its
// proportional set size (Pss, from /proc/PID/smaps) outside the region's memfd mappings, i.e.
// whatever private copies reading and steering made. mem.tp8_ratio is that over 8 private
// copies of the payload (each counted at exactly its payload size, which flatters the private
// copies).
const (
	tp8Ranks  = 8
	tp8Sets   = 16
	tp8Layers = 8
	// A rank settles (see settleRuntime) once its own Pss has not grown over tp8StableCycles
	// GC cycles in a row, or after tp8MaxCycles.
	tp8StableCycles = 2
	tp8MaxCycles    = 16
)

var tp8Model = steer.ModelConfig{Hidden: stepD, Layers: tp8Layers, Hooks: []string{"pre_attn", "post_attn"}}

func tp8Ratio() (float64, string, error) {
	cfg := tp8Model
	rc, err := steer.RegionConfig(cfg, shm.Config{IndexSlots: 4096, ArenaBytes: 64 << 20})
	if err != nil {
		return 0, "", err
	}
	o, _, ns, err := newOwnerWithKeys(rc, benchKeys())
	if err != nil {
		return 0, "", err
	}
	payload := int64(numKeys * valueSize)
	eng, err := steer.Open(o.Region(), &cfg, steer.Options{Clients: o.Clients})
	if err != nil {
		o.Close()
		return 0, "", err
	}
	vec := make([]float32, stepD)
	for s := range tp8Sets {
		var vs []steer.Vector
		for j := range tp8Layers * 2 {
			for i := range vec {
				vec[i] = float32(s*j+i) / stepD
			}
			vs = append(vs, steer.Vector{Hook: cfg.HookName(steer.HookID(j % 2)), Layer: j / 2, Scale: 1, Data: vec})
			payload += int64(4 * len(vec))
		}
		if _, err := eng.Register(fmt.Sprintf("set-%02d", s), vs); err != nil {
			o.Close()
			return 0, "", err
		}
		st := steer.Steering{Base: steer.Tier{Refs: []steer.Ref{{Name: fmt.Sprintf("set-%02d", s), Strength: 1}}}}
		if _, err := eng.Admit(steer.Admission{RequestID: fmt.Sprintf("tp8-%02d", s), Override: &st}); err != nil {
			o.Close()
			return 0, "", err
		}
	}
	procs, cleanup, err := startAttached(o, tp8Ranks, ns, "rank")
	if err != nil {
		return 0, "", err
	}
	ratio, note, err := measureRanks(o, procs, payload)
	return ratio, note, errors.Join(err, cleanup())
}

func measureRanks(o *ipc.Owner, procs []*proc, payload int64) (float64, string, error) {
	// Each rank settles through the round protocol right before its first reading, so the
	// protocol's own buffers (the command scanner's, the reply encoder's) are in place too.
	for _, p := range procs {
		if _, err := p.Run("settle", 1); err != nil {
			return 0, "", err
		}
	}
	before := make([]pss, len(procs))
	for i, p := range procs {
		var err error
		if before[i], err = readPss(p.Pid()); err != nil {
			return 0, "", err
		}
	}
	for _, p := range procs {
		if _, err := p.Run("read", 1); err != nil {
			return 0, "", err
		}
	}
	var private, shared, total int64
	for i, p := range procs {
		after, err := readPss(p.Pid())
		if err != nil {
			return 0, "", err
		}
		private += max(0, (after.total-after.memfd)-(before[i].total-before[i].memfd))
		shared += after.memfd
		total += after.total
	}
	region, err := residentBytes(o.Region())
	if err != nil {
		return 0, "", err
	}
	held := region + private
	note := fmt.Sprintf("%d rank processes attached, each read every key and vector and stepped all %d requests at every site: region resident %s (once; the ranks' Pss of it sums to %s), ranks' private growth %s (their whole Pss %s); payload %s, 8 copies %s",
		len(procs), tp8Sets, mib(region), mib(shared), mib(private), mib(total), mib(payload), mib(tp8Ranks*payload))
	return float64(held) / float64(tp8Ranks*payload), note, nil
}

func mib(n int64) string { return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20)) }

// residentBytes is the region's resident memory: the blocks allocated to its two memfds.
func residentBytes(r *shm.Region) (int64, error) {
	data, readers := r.Files()
	var held int64
	for _, f := range []*os.File{data, readers} {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			return 0, fmt.Errorf("bench: stat region memfd: %w", err)
		}
		held += st.Blocks * 512
	}
	return held, nil
}

// pss is a process's proportional set size in bytes: in all and in its memfd mappings.
type pss struct{ total, memfd int64 }

func readPss(pid int) (pss, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps")
	if err != nil {
		return pss{}, err
	}
	return parseSmaps(b)
}

// parseSmaps sums the Pss lines of an smaps file, and separately those of mappings whose path
// is a memfd ("/memfd:NAME (deleted)").
func parseSmaps(b []byte) (pss, error) {
	var p pss
	inMemfd := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			// A mapping header: "start-end perms offset dev inode [path]".
			inMemfd = len(f) >= 6 && strings.HasPrefix(f[5], "/memfd:")
			continue
		}
		if f[0] != "Pss:" || len(f) < 3 {
			continue
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return pss{}, fmt.Errorf("bench: smaps: %q: %w", line, err)
		}
		p.total += kb << 10
		if inMemfd {
			p.memfd += kb << 10
		}
	}
	return p, sc.Err()
}

// rankChild serves "settle" (settleRuntime) and "read": read every key and every vector entry
// of the region and apply the steering of every request at every (hook, layer) to one row
// each, then return the freed heap to the OS so that only what the rank keeps counts in its
// Pss.
func rankChild(c *ipc.Client, reg *keys.Worker) (map[string]Op, func() error, error) {
	cfg, err := steer.ConfigOf(c.Region())
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	eng, err := steer.Attach(c.Region(), &cfg, steer.Options{Caller: c})
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	st := eng.NewStepper()
	var batch []steer.Span
	for s := range tp8Sets {
		batch = append(batch, steer.Span{ID: fmt.Sprintf("tp8-%02d", s), Start: s, End: s + 1, Phase: steer.PhaseDecode})
	}
	// h stands for the model's hidden state: a forward pass has written it before any hook
	// sees it, so it is written here, before the first reading. (Left as a fresh zeroed
	// allocation, its first touch was Apply's: 256 KiB a rank of activations, which private
	// copies of the payload would need as much, counted as steering's growth.)
	h := make([]float32, len(batch)*cfg.Hidden)
	for i := range h {
		h[i] = 1
	}
	keys := benchKeys()
	buf := make([]byte, 0, valueSize)
	read := func() error {
		for _, k := range keys {
			var err error
			if buf, err = reg.Get(k, buf[:0]); err != nil {
				return err
			}
		}
		snap, err := c.Region().Snapshot()
		if err != nil {
			return err
		}
		var sum byte
		err = snap.Range(steer.KindVector, func(_, value []byte, _ uint64) bool {
			for _, b := range value {
				sum ^= b
			}
			return true
		})
		snap.Close()
		if err != nil {
			return err
		}
		if err := st.Begin(0); err != nil {
			return err
		}
		for hk := range cfg.NumHooks() {
			for l := range cfg.Layers {
				if err := st.Apply(steer.HookID(hk), l, h, batch); err != nil {
					st.End()
					return err
				}
			}
		}
		st.End()
		h[0] += float32(sum) // keep the reads observable
		debug.FreeOSMemory()
		return nil
	}
	ops := map[string]Op{"settle": goOp(func(n int) error {
		for range n {
			settleRuntime()
		}
		return nil
	}), "read": goOp(func(n int) error {
		for range n {
			if err := read(); err != nil {
				return err
			}
		}
		return nil
	})}
	return ops, func() error { st.Close(); return c.Close() }, nil
}

// settleRuntime brings a rank's Go runtime to its steady state before the parent's first Pss
// reading: it runs GC cycles, each returning the freed heap to the OS as the read's own cycle
// does (FreeOSMemory), until the rank's own Pss (ownPss) has not grown over tp8StableCycles
// cycles in a row, at most tp8MaxCycles; it returns the cycles run. What a cycle touches
// whatever the rank does (the GC's mark-bit arenas, recycled and cleared every few cycles, and
// heap metadata) is then in the baseline: after a fixed three cycles, a rank that only ran
// three more cycles, reading nothing, still grew 64-96 KiB, about a quarter of what a reading
// rank grew; once settled, 0-36 KiB. The rollup is read into one buffer allocated before the
// first cycle, so the measuring leaves no garbage in the baseline.
func settleRuntime() int {
	buf := make([]byte, 4096)
	last, stable := int64(-1), 0
	for i := 1; ; i++ {
		debug.FreeOSMemory()
		own, err := ownPss(buf)
		if err != nil {
			return i
		}
		if own <= last {
			stable++
		} else {
			stable = 0
		}
		last = max(last, own)
		if stable >= tp8StableCycles || i >= tp8MaxCycles {
			return i
		}
	}
}

// ownPss is this process's Pss outside shared memory, in KiB: Pss_Anon + Pss_File of
// /proc/self/smaps_rollup (the region's memfd pages are Pss_Shmem), read into buf.
func ownPss(buf []byte) (int64, error) {
	f, err := os.Open("/proc/self/smaps_rollup")
	if err != nil {
		return 0, err
	}
	n, err := f.Read(buf)
	f.Close()
	if err != nil {
		return 0, err
	}
	return parseRollupOwn(buf[:n])
}

// parseRollupOwn sums the Pss_Anon and Pss_File lines (in kB) of an smaps_rollup file.
func parseRollupOwn(b []byte) (int64, error) {
	var own int64
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		name, rest, ok := bytes.Cut(line, []byte(":"))
		if !ok || (string(name) != "Pss_Anon" && string(name) != "Pss_File") {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) != 2 || string(f[1]) != "kB" {
			return 0, fmt.Errorf("bench: smaps_rollup: %q", line)
		}
		kb, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("bench: smaps_rollup: %q: %w", line, err)
		}
		own += kb
	}
	return own, nil
}
