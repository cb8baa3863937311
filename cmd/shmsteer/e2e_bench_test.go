package main

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"syscall"
	"testing"
)

// Model size of the figures: 5 hooks × 32 layers × hidden 4096.
const benchHidden, benchLayers = 4096, 32

var benchHooks = []string{"pre_attn", "post_attn", "post_block", "mlp_in", "mlp_out"}

// benchSet is {hook: packed float32 [32, 4096]} for hooks, seeded.
func benchSet(seed uint64, hooks []string) map[string]any {
	r := rand.New(rand.NewPCG(seed, 9))
	out := map[string]any{}
	layers := make([]int, benchLayers)
	for i := range layers {
		layers[i] = i
	}
	for _, h := range hooks {
		raw := make([]byte, 0, benchLayers*benchHidden*4)
		for range benchLayers * benchHidden {
			raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(float32(r.NormFloat64())))
		}
		out[h] = map[string]any{"dtype": "float32", "shape": []int{benchLayers, benchHidden}, "layer_indices": layers,
			"data": base64.StdEncoding.EncodeToString(raw)}
	}
	return out
}

func benchServe(b *testing.B, stateDir string) *served {
	return startServe(b, ns(b), stateDir, "--hidden", fmt.Sprint(benchHidden), "--layers", fmt.Sprint(benchLayers),
		"--arena-bytes", fmt.Sprint(1<<30), "--index-slots", "65536", "--max-body-bytes", fmt.Sprint(256<<20))
}

func post(b *testing.B, s *served, path string, body []byte) {
	req, _ := http.NewRequest("POST", s.addr+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("%s: %d %s", path, resp.StatusCode, msg)
	}
}

// BenchmarkControlAPI times control API calls end to end (HTTP on loopback to the serve
// binary, JSON and base64 decoding, validation, the region write, and with a state dir the
// fsynced state files): registering a 5 hooks × 32 layers × 4096 named vector set, and setting
// global steering to such a set inline (packed) or by reference.
func BenchmarkControlAPI(b *testing.B) {
	reg, _ := json.Marshal(map[string]any{"name": "big", "kind": "steer", "packed": benchSet(1, benchHooks)})
	setPacked, _ := json.Marshal(map[string]any{"replace": true, "vectors": benchSet(2, benchHooks)})
	setRef, _ := json.Marshal(map[string]any{"replace": true, "vector_refs": map[string]float32{"big": 0.5}})
	for _, mode := range []string{"memory", "statedir"} {
		b.Run(mode, func(b *testing.B) {
			dir := ""
			if mode == "statedir" {
				dir = filepath.Join(b.TempDir(), "state")
			}
			s := benchServe(b, dir)
			post(b, s, "/v1/steering/vectors/register", reg)
			b.Run("register_5x32x4096", func(b *testing.B) {
				b.SetBytes(int64(len(reg)))
				for range b.N {
					post(b, s, "/v1/steering/vectors/register", reg)
				}
			})
			b.Run("set_global_packed_5x32x4096", func(b *testing.B) {
				b.SetBytes(int64(len(setPacked)))
				for range b.N {
					post(b, s, "/v1/steering/set", setPacked)
				}
			})
			b.Run("set_global_ref", func(b *testing.B) {
				for range b.N {
					post(b, s, "/v1/steering/set", setRef)
				}
			})
			b.Run("clear", func(b *testing.B) {
				for range b.N {
					post(b, s, "/v1/steering/clear", nil)
				}
			})
			s.stop(syscall.SIGTERM)
		})
	}
}

// BenchmarkRestart times a restart of serve with 100 named vectors in its state dir: from
// exec to the "listening on" line (process start, region creation, reading and verifying the
// state, re-registering every vector), for vectors of 1 and of 5 hooks × 32 layers × 4096.
func BenchmarkRestart(b *testing.B) {
	for _, hooks := range []int{1, 5} {
		b.Run(fmt.Sprintf("100_vectors_%dx32x4096", hooks), func(b *testing.B) {
			dir := filepath.Join(b.TempDir(), "state")
			s := benchServe(b, dir)
			for i := range 100 {
				body, _ := json.Marshal(map[string]any{"name": fmt.Sprintf("v%03d", i), "kind": "steer", "packed": benchSet(uint64(i), benchHooks[:hooks])})
				post(b, s, "/v1/steering/vectors/register", body)
			}
			if err := s.stop(syscall.SIGTERM); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {

				s = benchServe(b, dir)
				b.StopTimer()
				var m map[string]any
				req, _ := http.NewRequest("GET", s.addr+"/v1/status", nil)
				req.Header.Set("Authorization", "Bearer "+adminKey)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				json.NewDecoder(resp.Body).Decode(&m)
				resp.Body.Close()
				if m["named_vectors"] != 100.0 {
					b.Fatalf("restored %v named vectors", m["named_vectors"])
				}
				if err := s.stop(syscall.SIGTERM); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
