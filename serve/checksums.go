package serve

import (
	"encoding/binary"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/steer"
)

// OpReportChecksum is the RPC op by which a worker reports its step apply checksum to serve,
// which shows every worker's last report in GET /v1/steering/dynamic.
const OpReportChecksum uint16 = proto.OpReportChecksum

// maxChecksumWorkers bounds how many workers' reports serve keeps.
const maxChecksumWorkers = 4096

// ReportChecksum sends a worker's determinism checksum after step (a steer.Stepper's
// checksum) to the owner; worker names it (1..64 bytes, e.g. "rank0").
func ReportChecksum(c steer.Caller, worker string, step, checksum uint64) error {
	if len(worker) == 0 || len(worker) > 64 {
		return badInput("worker name of %d bytes: want 1..64", len(worker))
	}
	req := binary.LittleEndian.AppendUint64(nil, step)
	req = binary.LittleEndian.AppendUint64(req, checksum)
	_, err := c.Call(OpReportChecksum, append(req, worker...))
	return err
}

type checksumReport struct {
	step, sum uint64
	at        time.Time
}

// checksums holds the last report of each worker.
type checksums struct {
	mu sync.Mutex
	m  map[string]checksumReport
}

func (c *checksums) handle(req []byte) ([]byte, error) {
	if len(req) < 17 || len(req) > 16+64 {
		return nil, badInput("checksum report of %d bytes", len(req))
	}
	w := string(req[16:])
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]checksumReport{}
	}
	if _, ok := c.m[w]; !ok && len(c.m) >= maxChecksumWorkers {
		return nil, fmt.Errorf("%w: more than %d workers reporting checksums", ErrBadInput, maxChecksumWorkers)
	}
	c.m[w] = checksumReport{step: binary.LittleEndian.Uint64(req), sum: binary.LittleEndian.Uint64(req[8:]), at: time.Now()}
	return nil, nil
}

// workerChecksum is one worker's last report.
type workerChecksum struct {
	Worker     string  `json:"worker"`
	Step       uint64  `json:"step"`
	Checksum   string  `json:"checksum"`
	AgeSeconds float64 `json:"age_seconds"`
}

// report lists the reports and whether the workers at the newest step agree (nil with fewer
// than two such workers).
func (c *checksums) report() ([]workerChecksum, *bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := []workerChecksum{}
	var top uint64
	for _, r := range c.m {
		top = max(top, r.step)
	}
	n, agree, first := 0, true, uint64(0)
	for w, r := range c.m {
		out = append(out, workerChecksum{Worker: w, Step: r.step, Checksum: fmt.Sprintf("%016x", r.sum), AgeSeconds: time.Since(r.at).Seconds()})
		if r.step == top {
			if n == 0 {
				first = r.sum
			} else if r.sum != first {
				agree = false
			}
			n++
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Worker < out[j].Worker })
	if n < 2 {
		return out, nil
	}
	return out, &agree
}
