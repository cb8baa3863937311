package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
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
// attaching to just after reading and stepping, of its proportional set size (Pss, from
// /proc/PID/smaps) outside the region's memfd mappings, i.e. whatever private copies reading and
// steering made. mem.tp8_ratio is that over 8 private copies of the payload (each counted at
// exactly its payload size, which flatters the private copies).
const (
	tp8Ranks  = 8
	tp8Sets   = 16
	tp8Layers = 8
	// tp8SettleCycles is how many GC cycles a rank runs before it reports ready (see
	// rankChild).
	tp8SettleCycles = 3
)

var tp8Model = steer.ModelConfig{Hidden: stepD, Layers: tp8Layers, Hooks: []string{"pre_attn", "post_attn"}}

func tp8Ratio() (float64, string, error) {
	cfg := tp8Model
	rc, err := steer.RegionConfig(cfg, shm.Config{IndexSlots: 4096, ArenaBytes: 64 << 20})
	if err != nil {
		return 0, "", err
	}
	o, _, ns, err := newOwnerWithKeys(rc, Keys())
	if err != nil {
		return 0, "", err
	}
	payload := int64(NumKeys * ValueSize)
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

func measureRanks(o *ipc.Owner, procs []*Proc, payload int64) (float64, string, error) {
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

// rankChild serves "read": read every key and every vector entry of the region and apply the
// steering of every request at every (hook, layer) to one row each, then return the freed heap
// to the OS so that only what the rank keeps counts in its Pss.
func rankChild(c *ipc.Client, reg *keys.Registry) (map[string]Op, func() error, error) {
	cfg, err := steer.ConfigOf(c.Region())
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	eng, err := steer.Open(c.Region(), &cfg, steer.Options{Caller: c})
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	st := eng.NewStepper()
	var batch []steer.Span
	for s := range tp8Sets {
		batch = append(batch, steer.Span{ID: fmt.Sprintf("tp8-%02d", s), Start: s, End: s + 1, Phase: steer.PhaseDecode})
	}
	h := make([]float32, len(batch)*cfg.Hidden)
	keys := Keys()
	buf := make([]byte, 0, ValueSize)
	// Bring the runtime to its steady state before the parent's first Pss reading: the GC's
	// metadata (the mark bits of the spans, kept for two cycles) and the heap it releases only
	// settle after a few cycles, and the read ends with a cycle of its own (FreeOSMemory). From
	// one cycle only, the ranks' growth counted the runtime's later-cycle metadata (about half
	// of what a rank grew) as the reads', where the rank's live heap grows by tens of KiB.
	for range tp8SettleCycles {
		runtime.GC()
	}
	debug.FreeOSMemory()
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
	ops := map[string]Op{"read": GoOp(func(n int) error {
		for range n {
			if err := read(); err != nil {
				return err
			}
		}
		return nil
	})}
	return ops, func() error { st.Close(); return c.Close() }, nil
}
