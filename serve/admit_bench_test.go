package serve

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/steer"
	"github.com/shmsteer/shmsteer/steer/vecfile"
)

// BenchmarkAdmitHTTP times POST /v1/requests/admit (a serve in this process, over loopback
// HTTP) of an override of 32 layers × 4096 floats at post_block, decode tier: as JSON float
// lists ({hook: {layer: [floats]}}), as the fork's packed blob (SteeringHookPacked, float32,
// base64), and a reference to a named vector of that shape (decode_vector_refs). Each
// admission is ended again, untimed. Run:
//
//	go test -run '^$' -bench BenchmarkAdmitHTTP -benchtime 20x -count 3 ./serve/
func BenchmarkAdmitHTTP(b *testing.B) {
	const hidden, layers = 4096, 32
	dir := b.TempDir()
	secretFile := filepath.Join(dir, "secret")
	require.NoError(b, os.WriteFile(secretFile, []byte("bench-admit-secret"), 0o600))
	cfg := DefaultConfig()
	cfg.Namespace = fmt.Sprintf("bench-admit-%d", os.Getpid())
	cfg.Hidden, cfg.Layers, cfg.ArenaBytes, cfg.IndexSlots = hidden, layers, 512<<20, 1024
	cfg.HTTP, cfg.SecretFile, cfg.StateDir, cfg.Auth = "127.0.0.1:0", secretFile, filepath.Join(dir, "state"), AuthFork
	ctx, cancel := context.WithCancel(context.Background())
	w := &lineWriter{addr: make(chan string, 1)}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, w, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	var addr string
	select {
	case a := <-w.addr:
		addr = "http://" + a
	case err := <-done:
		b.Fatalf("Run: %v", err)
	case <-time.After(20 * time.Second):
		b.Fatal("Run did not listen")
	}
	b.Cleanup(func() { cancel(); <-done })

	rng := rand.New(rand.NewPCG(4, 3))
	rows := make([][]float32, layers)
	var packed []byte
	lists := map[string]any{}
	idx := make([]int, layers)
	for l := range rows {
		rows[l] = make([]float32, hidden)
		for i := range rows[l] {
			rows[l][i] = float32(rng.NormFloat64() * 0.01)
			packed = binary.LittleEndian.AppendUint32(packed, math.Float32bits(rows[l][i]))
		}
		lists[strconv.Itoa(l)] = rows[l]
		idx[l] = l
	}
	blob := map[string]any{"dtype": "float32", "shape": []int{layers, hidden}, "layer_indices": idx,
		"data": base64.StdEncoding.EncodeToString(packed)}
	post := func(path string, body []byte) {
		resp, err := http.Post(addr+path, "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		reply, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("%s: %d %s", path, resp.StatusCode, reply)
		}
	}
	mustJSON := func(v any) []byte {
		j, err := json.Marshal(v)
		require.NoError(b, err)
		return j
	}
	post("/v1/steering/vectors/register", mustJSON(map[string]any{"name": "named", "kind": "steer", "packed": map[string]any{"post_block": blob}}))
	for _, c := range []struct {
		name     string
		override map[string]any
	}{
		{"lists", map[string]any{"decode_vectors": map[string]any{"post_block": lists}}},
		{"packed", map[string]any{"decode_vectors": map[string]any{"post_block": blob}}},
		{"named", map[string]any{"decode_vector_refs": map[string]float32{"named": 1}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				id := fmt.Sprint(c.name, "-", i)
				body := mustJSON(map[string]any{"request_id": id, "override": c.override}) // the client's encoding, timed
				post("/v1/requests/admit", body)
				b.StopTimer()
				post("/v1/requests/end", mustJSON(map[string]any{"request_id": id}))
				b.StartTimer()
			}
		})
	}
}

// BenchmarkPackedDecode times one hook's packed blob of 32 layers × 4096 float32 decoded to
// vectors: by vecfile (encoding/base64, then a conversion pass) and by fastPackedVectors
// (serve's table decoder), alternated by -count. Run:
//
//	go test -run '^$' -bench BenchmarkPackedDecode -count 5 ./serve/
func BenchmarkPackedDecode(b *testing.B) {
	var body struct {
		Override struct {
			DecodeVectors map[string]vecfile.Packed `json:"decode_vectors"`
		} `json:"override"`
	}
	require.NoError(b, json.Unmarshal(packedBody(b, 32, 4096), &body))
	p := body.Override.DecodeVectors["post_block"]
	b.Run("vecfile", func(b *testing.B) {
		for b.Loop() {
			if _, err := p.Vectors("post_block"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fast", func(b *testing.B) {
		for b.Loop() {
			if _, ok := fastPackedVectors(&p, p.Data, "post_block"); !ok {
				b.Fatal("not taken")
			}
		}
	})
}

// BenchmarkAdmitParse times the parse of an admit body with an inline packed override of 32
// layers × 4096 float32 (700 KB of base64), without HTTP and the engine: decodeAdmitRequest
// and the override's Steering. Run:
//
//	go test -run '^$' -bench BenchmarkAdmitParse -count 5 ./serve/
func BenchmarkAdmitParse(b *testing.B) {
	body := packedBody(b, 32, 4096)
	cfg := steer.ModelConfig{Hidden: 4096, Layers: 32}
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		req, err := decodeAdmitRequest(body)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := req.Override.Steering(cfg); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAdmissionFromRequest times AdmissionFromRequest of an OpenAI body whose
// decode_steering_vectors hold one packed blob of 32 layers × 4096 float32 (700 KB of base64).
// Run:
//
//	go test -run '^$' -bench BenchmarkAdmissionFromRequest -count 5 ./serve/
func BenchmarkAdmissionFromRequest(b *testing.B) {
	var admit struct {
		Override struct {
			DecodeVectors json.RawMessage `json:"decode_vectors"`
		} `json:"override"`
	}
	require.NoError(b, json.Unmarshal(packedBody(b, 32, 4096), &admit))
	body, err := json.Marshal(map[string]any{"model": "m", "conversation_id": "c",
		"decode_steering_vectors": admit.Override.DecodeVectors})
	require.NoError(b, err)
	cfg := steer.ModelConfig{Hidden: 4096, Layers: 32}
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := AdmissionFromRequest(body, cfg, OpenAIOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}
