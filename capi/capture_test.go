package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/shmsteer/shmsteer/capture"
	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/steer"
)

// captureRecord is record seq of the capture role's deterministic stream (test_capture.py
// computes the same): layer seq%4 at post_block, 1+seq%3 rows of 64 elements at positions
// 10*seq+i; element j of the record is float32(seq*1000+j) (f32), or the raw uint16
// seq*7+j (bf16 and f16, which a test compares as bits).
func captureRecord(seq int, d capture.Dtype) capture.Record {
	rows, width := 1+seq%3, fixtureModel.Hidden
	r := capture.Record{Layer: seq % 4, Hook: "post_block", Dtype: d, Rows: rows, Width: width}
	for i := range rows {
		r.Positions = append(r.Positions, 10*seq+i)
	}
	for j := range rows * width {
		if d == capture.Float32 {
			r.Data = binary.LittleEndian.AppendUint32(r.Data, math.Float32bits(float32(seq*1000+j)))
		} else {
			r.Data = binary.LittleEndian.AppendUint16(r.Data, uint16(seq*7+j))
		}
	}
	return r
}

// burstRecord is record k of burst seed (test_capture.py computes the same): layer l at
// post_block, rows rows of width elements of d at positions seed*100000+k*rows+i; element j's
// raw bits are (seed*7919 + k*131 + j) mod 2^16 for bf16 and f16, that plus k<<16 for f32.
func burstRecord(seed, k, l, rows, width int, d capture.Dtype) capture.Record {
	r := capture.Record{Layer: l, Hook: "post_block", Dtype: d, Rows: rows, Width: width}
	for i := range rows {
		r.Positions = append(r.Positions, seed*100000+k*rows+i)
	}
	for j := range rows * width {
		v := uint32(seed*7919+k*131+j) & 0xFFFF
		if d == capture.Float32 {
			r.Data = binary.LittleEndian.AppendUint32(r.Data, v|uint32(k)<<16)
		} else {
			r.Data = binary.LittleEndian.AppendUint16(r.Data, uint16(v))
		}
	}
	return r
}

// runCaptureRole is the fixture owner with a capture hub declaring consumer "py", and a worker
// ring of its own; it takes commands on stdin, one per line, answering one line each:
//
//	begin ID PROMPT SPEC   Hub.Begin(ID, {"py": SPEC}, PROMPT)           → ok
//	append ID SEQ DTYPE    captureRecord(SEQ, DTYPE) into the ring       → ok | err MESSAGE
//	end ID                 Hub.End(ID)                                   → ok
//	result ID              Hub.Result once py's is not pending (≤ 10 s) → the JSON
//	step REQS LAYERS W     one decode step: REQS requests (req-0..) × LAYERS post_block
//	                       records of 1 row × W float32 (begun for py at the first step)  → ok
//	burst REQS LAYERS ROWS W DTYPE SEED
//	                       step's records with ROWS rows of W elements of DTYPE each, record k
//	                       of the burst burstRecord(SEED, k, …)                           → ok
//
// SHMSTEER_CAPTURE_RING (bytes) sets the worker ring's capacity (80 MiB by default).
func runCaptureRole() int {
	secret, ns := os.Getenv("SHMSTEER_SECRET"), os.Getenv("SHMSTEER_TEST_NS")
	o, _, err := startGoOwner(secret, ns)
	if err != nil {
		fmt.Fprintln(os.Stderr, "owner:", err)
		return 1
	}
	defer o.Close()
	hub, err := capture.NewHub(capture.HubOptions{Consumers: map[string]string{"py": "filesystem"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "hub:", err)
		return 1
	}
	defer hub.Close()
	hub.Serve(func(op uint16, h func([]byte) ([]byte, error)) { o.Handle(op, h) })
	s := ipc.NewSecret([]byte(secret))
	cl, err := ipc.Attach(ipc.ClientOptions{Secret: &s, Namespace: ns})
	if err != nil {
		fmt.Fprintln(os.Stderr, "attach:", err)
		return 1
	}
	defer cl.Close()
	capacity := uint64(80 << 20)
	if v, err := strconv.ParseUint(os.Getenv("SHMSTEER_CAPTURE_RING"), 10, 64); err == nil {
		capacity = v
	}
	w, err := capture.RegisterWorker(cl, capture.WorkerOptions{Capacity: capacity, Wait: time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	defer w.Close()
	fmt.Println("ready")
	cr := &captureRole{hub: hub, w: w, begun: map[string]bool{}}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), " ", 4)
		reply := "ok"
		switch {
		case f[0] == "begin" && len(f) == 4:
			n, _ := strconv.Atoi(f[2])
			hub.Begin(f[1], steer.AdmittedCapture{Specs: map[string]json.RawMessage{"py": json.RawMessage(f[3])}, PromptLen: n})
		case f[0] == "append" && len(f) == 4:
			seq, _ := strconv.Atoi(f[2])
			if err := w.Writer().Append(f[1], captureRecord(seq, capture.Dtype(f[3]))); err != nil {
				reply = "err " + err.Error()
			}
		case f[0] == "step" && len(f) == 4:
			reqs, _ := strconv.Atoi(f[1])
			layers, _ := strconv.Atoi(f[2])
			width, _ := strconv.Atoi(f[3])
			reply = cr.step(reqs, layers, width)
		case f[0] == "burst" && len(f) == 4:
			reply = cr.burst(f[1] + " " + f[2] + " " + f[3])
		case f[0] == "end" && len(f) == 2:
			hub.End(f[1])
		case f[0] == "result" && len(f) == 2:
			reply = cr.result(f[1])
		default:
			reply = "err unknown command"
		}
		fmt.Println(reply)
	}
	return 0
}

// captureRole is runCaptureRole's state: its hub, its worker, and the requests begun for the
// consumer "py" by step and burst.
type captureRole struct {
	hub   *capture.Hub
	w     *capture.Worker
	begun map[string]bool
}

// begin begins request id for "py" (an empty spec, a prompt of one) unless it is begun already.
func (cr *captureRole) begin(id string) {
	if !cr.begun[id] {
		cr.begun[id] = true
		cr.hub.Begin(id, steer.AdmittedCapture{Specs: map[string]json.RawMessage{"py": json.RawMessage(`{}`)}, PromptLen: 1})
	}
}

// step appends one decode step: for requests req-0..req-(reqs-1) (begun first), layers records
// of one row of width float32 each; "ok" or the last append's error.
func (cr *captureRole) step(reqs, layers, width int) string {
	reply := "ok"
	rec := capture.Record{Hook: "post_block", Dtype: capture.Float32, Rows: 1, Width: width, Positions: []int{0}, Data: make([]byte, 4*width)}
	for i := range rec.Data {
		rec.Data[i] = byte(i)
	}
	for r := range reqs {
		cr.begin("req-" + strconv.Itoa(r))
	}
	for l := range layers {
		rec.Layer = l
		for r := range reqs {
			if err := cr.w.Writer().Append("req-"+strconv.Itoa(r), rec); err != nil {
				reply = "err " + err.Error()
			}
		}
	}
	return reply
}

// burst appends the records "REQS LAYERS ROWS W DTYPE SEED" in args names: record k of the
// burst is burstRecord(SEED, k, …); "ok" or the last error.
func (cr *captureRole) burst(args string) string {
	var reqs, layers, rows, width, seed int
	var dtype string
	if _, err := fmt.Sscan(args, &reqs, &layers, &rows, &width, &dtype, &seed); err != nil {
		return "err " + err.Error()
	}
	reply := "ok"
	k := 0
	for l := range layers {
		for r := range reqs {
			id := "req-" + strconv.Itoa(r)
			cr.begin(id)
			rec := burstRecord(seed, k, l, rows, width, capture.Dtype(dtype))
			if err := cr.w.Writer().Append(id, rec); err != nil {
				reply = "err " + err.Error()
			}
			k++
		}
	}
	return reply
}

// result is request id's result as JSON, once "py" has published it (or after 10 s).
func (cr *captureRole) result(id string) string {
	var res map[string]capture.Result
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		res, _ = cr.hub.Result(id)
		if res["py"].Status != capture.StatusPending || time.Now().After(deadline) {
			break
		}
	}
	b, _ := json.Marshal(res)
	return string(b)
}
