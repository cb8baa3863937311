package serve

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/steer"
	"github.com/shmsteer/shmsteer/steer/vecfile"
)

var cfg8 = steer.ModelConfig{Hidden: 4, Layers: 3, Hooks: steer.DefaultHooks}

func packBytes(dtype string, vals []float64) string {
	var b []byte
	for _, v := range vals {
		switch dtype {
		case "float64":
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
		case "float32":
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(v)))
		case "bfloat16":
			b = binary.LittleEndian.AppendUint16(b, uint16(math.Float32bits(float32(v))>>16))
		case "float16":
			// exact small integers only
			f := math.Float32bits(float32(v))
			b = binary.LittleEndian.AppendUint16(b, uint16(f>>16)&0x8000|uint16((int(f>>23&0xff)-112))<<10|uint16(f>>13&0x3ff))
		}
	}
	return base64.StdEncoding.EncodeToString(b)
}

func TestPackedDtypes(t *testing.T) {
	vals := []float64{1, -2, 0.5, 4, 8, -16, 0.25, 2}
	for _, dt := range []string{"float16", "bfloat16", "float32", "float64"} {
		p := vecfile.Packed{Dtype: dt, Shape: []int{2, 4}, LayerIndices: []int{2, 0}, Data: packBytes(dt, vals), Scales: []float64{1, 3}}
		vs, err := packedVectors(&p, "pre_attn")
		require.NoError(t, err, dt)
		require.Equal(t, []float32{1, -2, 0.5, 4}, vs[0].Data, dt)
		require.Equal(t, []float32{8, -16, 0.25, 2}, vs[1].Data, dt)
		require.Equal(t, 2, vs[0].Layer)
		require.Equal(t, float32(3), vs[1].Scale)
	}
	for name, p := range map[string]vecfile.Packed{
		"dtype":  {Dtype: "int8", Shape: []int{1, 4}, LayerIndices: []int{0}},
		"shape":  {Dtype: "float32", Shape: []int{4}, LayerIndices: []int{0}},
		"layers": {Dtype: "float32", Shape: []int{1, 4}, LayerIndices: []int{0, 1}, Data: packBytes("float32", make([]float64, 4))},
		"scales": {Dtype: "float32", Shape: []int{1, 4}, LayerIndices: []int{0}, Scales: []float64{1, 2}, Data: packBytes("float32", make([]float64, 4))},
		"short":  {Dtype: "float32", Shape: []int{1, 4}, LayerIndices: []int{0}, Data: packBytes("float32", make([]float64, 3))},
		"long":   {Dtype: "float32", Shape: []int{1, 4}, LayerIndices: []int{0}, Data: packBytes("float32", make([]float64, 5))},
		"base64": {Dtype: "float32", Shape: []int{1, 4}, LayerIndices: []int{0}, Data: "!!!!" + packBytes("float32", make([]float64, 4))},
		"rows<1": {Dtype: "float32", Shape: []int{0, 4}},
		"huge":   {Dtype: "float32", Shape: []int{1 << 30, 4}, LayerIndices: []int{0}},
	} {
		_, err := packedVectors(&p, "pre_attn")
		require.ErrorIs(t, err, ErrBadInput, name)
	}
}

func TestSetRequestSteering(t *testing.T) {
	body := `{"vectors":{"pre_attn":{"1":[1,2,3,4],"0":{"vector":[0,0,0,1],"scale":2}}},
		"decode_vectors":{"mlp_out":{"dtype":"float32","shape":[1,4],"layer_indices":[2],"data":"` + packBytes("float32", []float64{1, 1, 1, 1}) + `"}},
		"clamps":{"mlp_in":{"0":[{"vector":[1,0,0,0],"value":0},{"vector":[0,1,0,0],"min":-1}]}},
		"prefill_clamps":{"mlp_in":{"2":{"vector":[1,1,0,0],"max":3,"strength":0.5}}},
		"vector_refs":{"b":1,"a":0.5},"replace":true}`
	var req setRequest
	require.NoError(t, decodePayload([]byte(body), &req))
	st, err := req.Steering(cfg8)
	require.NoError(t, err)
	require.Equal(t, []steer.Vector{{Hook: "pre_attn", Layer: 0, Scale: 2, Data: []float32{0, 0, 0, 1}}, {Hook: "pre_attn", Layer: 1, Scale: 1, Data: []float32{1, 2, 3, 4}}}, st.Base.Vectors)
	require.Equal(t, []steer.Ref{{Name: "a", Strength: 0.5}, {Name: "b", Strength: 1}}, st.Base.Refs)
	require.Len(t, st.Decode.Vectors, 1)
	require.Equal(t, float32(0), st.Base.Clamps[0].Min)
	require.Equal(t, float32(0), st.Base.Clamps[0].Max)
	require.Equal(t, float32(-1), st.Base.Clamps[1].Min)
	require.Equal(t, openBound, st.Base.Clamps[1].Max)
	require.LessOrEqual(t, float64(openBound), steer.MaxMagnitude)
	require.Equal(t, float32(0.5), st.Prefill.Clamps[0].Strength)
	_, _, err = steer.EncodeSteering(&st, cfg8)
	require.NoError(t, err)

	for name, b := range map[string]string{
		"unknown field":   `{"vectorz":{}}`,
		"trailing":        `{} {}`,
		"layer key":       `{"vectors":{"pre_attn":{"x":[1,2,3,4]}}}`,
		"entry type":      `{"vectors":{"pre_attn":{"0":"abc"}}}`,
		"entry no vector": `{"vectors":{"pre_attn":{"0":{"scale":1}}}}`,
		"entry no scale":  `{"vectors":{"pre_attn":{"0":{"vector":[1,2,3,4]}}}}`,
		"clamp no bound":  `{"clamps":{"mlp_in":{"0":{"vector":[1,0,0,0]}}}}`,
		"clamp both":      `{"clamps":{"mlp_in":{"0":{"vector":[1,0,0,0],"value":1,"max":2}}}}`,
		"clamp strength":  `{"clamps":{"mlp_in":{"0":{"vector":[1,0,0,0],"value":1,"strength":2}}}}`,
		"clamp empty":     `{"clamps":{"mlp_in":{"0":{"vector":[],"value":1}}}}`,
		"clamp zero":      `{"clamps":{"mlp_in":{"0":[{"vector":[0,0,0,0],"value":1}]}}}`,
		"clamp min>max":   `{"clamps":{"mlp_in":{"0":[{"vector":[1,0,0,0],"min":2,"max":1}]}}}`,
		"clamps array":    `{"clamps":[{"vector":[1,0,0,0],"value":1}]}`,
		"clamps hook arr": `{"clamps":{"mlp_in":[{"vector":[1,0,0,0],"value":1}]}}`,
		"hook not object": `{"vectors":{"pre_attn":[1,2]}}`,
		"packed clamp n":  `{"clamps":{"mlp_in":{"dtype":"float32","shape":[1,4],"layer_indices":[0,1],"data":"` + packBytes("float32", []float64{1, 0, 0, 0}) + `","bounds":[[0,1]],"strengths":[1]}}}`,
	} {
		var req setRequest
		err := decodePayload([]byte(b), &req)
		if err == nil {
			_, err = req.Steering(cfg8)
		}
		require.Error(t, err, name)
		if !errors.Is(err, steer.ErrBadClamp) {
			require.ErrorIs(t, err, ErrBadInput, name)
		}
		require.Contains(t, err.Error(), "Malformed steering payload", name)
		require.NotContains(t, err.Error(), "Go ", name)
		require.NotContains(t, err.Error(), "json:", name)
		require.NotContains(t, err.Error(), "setRequest", name)
	}

	// Packed clamps (the fork's ClampHookPacked): rows may share a layer, null bounds are open.
	body = `{"decode_clamps":{"mlp_in":{"dtype":"float64","shape":[3,4],"layer_indices":[1,0,1],"data":"` +
		packBytes("float64", []float64{1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 2, 0}) + `","bounds":[[null,2],[-1,null],[0.5,0.5]],"strengths":[1,0.5,0]}}}`
	req = setRequest{}
	require.NoError(t, decodePayload([]byte(body), &req))
	st, err = req.Steering(cfg8)
	require.NoError(t, err)
	require.Equal(t, []steer.Clamp{
		{Hook: "mlp_in", Layer: 1, Dir: []float32{1, 0, 0, 0}, Min: -openBound, Max: 2, Strength: 1},
		{Hook: "mlp_in", Layer: 0, Dir: []float32{0, 1, 0, 0}, Min: -1, Max: openBound, Strength: 0.5},
		{Hook: "mlp_in", Layer: 1, Dir: []float32{0, 0, 2, 0}, Min: 0.5, Max: 0.5, Strength: 0},
	}, st.Decode.Clamps)
	_, _, err = steer.EncodeSteering(&st, cfg8)
	require.NoError(t, err)
}

// FuzzSetRequest feeds arbitrary bodies through the /set parser and steer's validation: no
// panic, and whatever is accepted encodes and decodes back.
func FuzzSetRequest(f *testing.F) {
	for _, s := range []string{
		`{"vectors":{"pre_attn":{"1":[1,2,3,4]}}}`,
		`{"vectors":{"pre_attn":{"dtype":"float16","shape":[1,4],"layer_indices":[0],"data":"ADwAPAA8ADw="}}}`,
		`{"clamps":{"mlp_in":{"0":[{"vector":[1,0,0,0],"value":0}]}}}`,
		`{"decode_vectors":{"mlp_out":{"2":{"vector":[1,1,1,1],"scale":-1}}},"replace":true}`,
		`{"vectors":{"pre_attn":{"dtype":"bfloat16","shape":[2,4],"layer_indices":[0,0],"data":"AAAAAAAAAAAAAAAAAAAAAA=="}}}`,
		`{"clamps":{"mlp_in":{"dtype":"float16","shape":[1,4],"layer_indices":[0],"data":"ADwAPAA8ADw=","bounds":[[null,1]],"strengths":[0.5]}}}`,
		`{"prefill_clamps":{"hooks":{"mlp_in":{"shape":[1,4],"layer_indices":[1],"data":"AAAAAAAA8D8AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","lo":[null],"hi":[2],"strength":[1]}}}}`,
		`{"vectors":{"pre_attn":{"1":[NaN,-Infinity,"Infinity\"",4]}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req setRequest
		if err := decodePayload(b, &req); err != nil {
			noDecoderInternals(t, err)
			return
		}
		st, err := req.Steering(cfg8)
		if err != nil {
			noDecoderInternals(t, err)
			return
		}
		enc, d, err := steer.EncodeSteering(&st, cfg8)
		if err != nil {
			return
		}
		_, d2, err := steer.DecodeSteering(enc, cfg8)
		if err != nil || d != d2 {
			t.Fatalf("accepted steering does not round-trip: %v", err)
		}
	})
}

func TestStateFileRoundTripAndCorruption(t *testing.T) {
	p := &persisted{Model: cfg8, Vectors: []namedDigest{{Name: "a", Digest: steer.Digest{1}}}, Global: []byte("g"),
		Latches:    []steer.LatchEntry{{Key: steer.ConvKey{Tenant: "t", ID: "c"}, Steering: steer.Steering{Base: steer.Tier{Refs: []steer.Ref{{Name: "a", Strength: 1}}}}}},
		LatchStats: steer.LatchStats{Conversations: 1, Triggers: 3}}
	b, err := encodeState(p)
	require.NoError(t, err)
	got, err := decodeState(b)
	require.NoError(t, err)
	require.Equal(t, p, got)
	for i := range b {
		c := append([]byte(nil), b...)
		c[i] ^= 0x40
		_, err := decodeState(c)
		require.Error(t, err, "flipped byte %d accepted", i)
	}
	for _, n := range []int{0, 10, stateHeader, len(b) - 1} {
		_, err := decodeState(b[:n])
		require.ErrorIs(t, err, ErrStateCorrupt, n)
	}
	v2 := append([]byte(nil), b...)
	binary.LittleEndian.PutUint32(v2[16:], 2)
	_, err = decodeState(v2)
	require.ErrorIs(t, err, ErrStateIncompatible)

	// The store: save, load, a second process refused by the lock; unreferenced vector files go.
	dir := t.TempDir()
	st, err := openStateStore(dir)
	require.NoError(t, err)
	_, err = openStateStore(dir)
	require.ErrorIs(t, err, ErrStateLocked)
	none, err := st.load()
	require.NoError(t, err)
	require.Nil(t, none)
	wires := map[steer.Digest][]byte{{1}: []byte("vector-one")}
	require.NoError(t, st.save(p, func(d steer.Digest) ([]byte, error) { return wires[d], nil }))
	got, err = st.load()
	require.NoError(t, err)
	require.Equal(t, p, got)
	wb, err := st.readVector(steer.Digest{1})
	require.NoError(t, err)
	require.Equal(t, "vector-one", string(wb))
	p.Vectors = nil
	require.NoError(t, st.save(p, nil))
	_, err = os.Stat(st.vectorPath(steer.Digest{1}))
	require.True(t, os.IsNotExist(err))
	ents, _ := filepath.Glob(filepath.Join(dir, "*.tmp-*"))
	require.Empty(t, ents, "temporary files left behind")
	require.NoError(t, st.close())
	st2, err := openStateStore(dir)
	require.NoError(t, err)
	st2.close()
}

func TestConfigLayers(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.toml")
	require.NoError(t, os.WriteFile(file, []byte("namespace = \"fromfile\"\nhidden = 64\nlayers = 8\nhooks = [\"a\", \"b\"]\ngrace = \"5s\"\nlatch_policy = \"lru\"\nhttp = \"unix:/tmp/x.sock\"\n"), 0o600))
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	BindFlags(fs)
	require.NoError(t, fs.Parse([]string{"--config", file, "--layers", "12"}))
	env := map[string]string{"SHMSTEER_HIDDEN": "128", "SHMSTEER_LAYERS": "99", "SHMSTEER_STATE_DIR": "/var/lib/x"}
	c, err := Load(fs, func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Equal(t, "fromfile", c.Namespace)     // file
	require.Equal(t, 128, c.Hidden)               // env over file
	require.Equal(t, 12, c.Layers)                // flag over env
	require.Equal(t, []string{"a", "b"}, c.Hooks) // file
	require.Equal(t, 5*time.Second, c.Grace)      // file duration string
	require.Equal(t, steer.LRU, c.Policy())       // file
	require.Equal(t, "/var/lib/x", c.StateDir)    // env
	require.Equal(t, "unix:/tmp/x.sock", c.HTTP)  // file
	require.Equal(t, DefaultConfig().MaxBodyBytes, c.MaxBodyBytes)

	for name, tc := range map[string]struct {
		toml string
		env  map[string]string
		args []string
	}{
		"unknown key":   {toml: "nope = 1\n"},
		"bad toml":      {toml: "hidden = \n"},
		"bad env":       {env: map[string]string{"SHMSTEER_HIDDEN": "x"}},
		"bad policy":    {args: []string{"--latch-policy", "x"}},
		"bad hidden":    {args: []string{"--hidden", "0"}},
		"bad format":    {args: []string{"--log-format", "xml"}},
		"dup hooks":     {args: []string{"--hooks", "a,a"}},
		"empty ns":      {env: map[string]string{"SHMSTEER_NAMESPACE": ""}, args: []string{"--namespace", ""}},
		"tiny body":     {args: []string{"--max-body-bytes", "10"}},
		"persist zero":  {args: []string{"--persist-interval", "0s"}},
		"host id alone": {args: []string{"--host-id", "h1"}},
		"keys alone":    {env: map[string]string{"SHMSTEER_MIRROR_KEYS": "true"}},
		"mirror scheme": {args: []string{"--mirror", "http://127.0.0.1:4222"}},
		"mirror host":   {args: []string{"--mirror", "nats://"}},
		"mirror creds":  {args: []string{"--mirror", "nats://n:4222", "--mirror-creds", "/nonexistent/creds"}},
		"bad bool":      {args: []string{"--mirror", "nats://n:4222"}, env: map[string]string{"SHMSTEER_MIRROR_KEYS": "maybe"}},
	} {
		fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
		BindFlags(fs)
		args := tc.args
		if tc.toml != "" {
			f := filepath.Join(dir, "bad.toml")
			require.NoError(t, os.WriteFile(f, []byte(tc.toml), 0o600))
			args = append(args, "--config", f)
		}
		require.NoError(t, fs.Parse(args), name)
		_, err := Load(fs, func(k string) string { return tc.env[k] })
		require.ErrorIs(t, err, ErrConfig, name)
	}
}

// TestConfigMirror: the mirror settings come from the file, the environment and the flags
// like the others (mirror_keys is a boolean).
func TestConfigMirror(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.toml")
	require.NoError(t, os.WriteFile(file, []byte("mirror = \"nats://10.0.0.1:4222,nats://10.0.0.2:4222\"\nmirror_bucket = \"prod\"\nhost_id = \"file-host\"\n"), 0o600))
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	BindFlags(fs)
	require.NoError(t, fs.Parse([]string{"--config", file, "--host-id", "gpu-07"}))
	c, err := Load(fs, func(k string) string { return map[string]string{"SHMSTEER_MIRROR_KEYS": "true"}[k] })
	require.NoError(t, err)
	require.Equal(t, "nats://10.0.0.1:4222,nats://10.0.0.2:4222", c.Mirror)
	require.Equal(t, "prod", c.MirrorBucket)
	require.Equal(t, "gpu-07", c.HostID) // flag over file
	require.True(t, c.MirrorKeys)        // env
	require.Empty(t, c.MirrorCreds)

	fs = pflag.NewFlagSet("serve", pflag.ContinueOnError)
	BindFlags(fs)
	require.NoError(t, fs.Parse([]string{"--mirror", "nats://n:4222", "--mirror-keys"}))
	c, err = Load(fs, func(string) string { return "" })
	require.NoError(t, err)
	require.True(t, c.MirrorKeys)
	require.Empty(t, c.HostID, "empty: the mirror takes the hostname")
}

func TestAPIKeyFileMode(t *testing.T) {
	p := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, os.WriteFile(p, []byte("admin-0123456789abcdef\n"), 0o644))
	var k apiKeys
	_, err := k.load(p)
	require.ErrorIs(t, err, ErrAPIKeyFile)
	require.NoError(t, os.Chmod(p, 0o600))
	n, err := k.load(p)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

func TestAPIKeys(t *testing.T) {
	keys, err := parseAPIKeys([]byte("# c\n\nadmin-0123456789abcdef\nacme:acme-0123456789abcdef\n"))
	require.NoError(t, err)
	require.Len(t, keys, 2)
	var k apiKeys
	k.keys = keys
	try := func(h string) (principal, error) {
		r, _ := http.NewRequest("GET", "/v1/status", nil)
		if h != "" {
			r.Header.Set("Authorization", h)
		}
		return k.authenticate(r)
	}
	p, err := try("Bearer admin-0123456789abcdef")
	require.NoError(t, err)
	require.True(t, p.admin())
	p, err = try("bearer acme-0123456789abcdef")
	require.NoError(t, err)
	require.Equal(t, "acme", p.tenant)
	require.True(t, p.owns("acme/x"))
	require.False(t, p.owns("acmex/x"))
	require.False(t, p.owns("x"))
	for _, h := range []string{"", "Bearer", "Bearer ", "Basic admin-0123456789abcdef", "Bearer admin-0123456789abcdeF", "Bearer acme:acme-0123456789abcdef"} {
		_, err := try(h)
		require.ErrorIs(t, err, ErrUnauthorized, h)
	}
	for name, b := range map[string]string{"short": "short\n", "tenant": "bad tenant!:0123456789abcdef0\n"} {
		_, err := parseAPIKeys([]byte(b))
		require.ErrorIs(t, err, ErrAPIKeyFile, name)
		require.NotContains(t, err.Error(), "0123456789abcdef0", "a key leaked into an error")
	}
}

func TestMergeGlobal(t *testing.T) {
	cur := steer.Steering{Base: steer.Tier{
		Vectors: []steer.Vector{{Hook: "a", Layer: 0, Scale: 1}, {Hook: "a", Layer: 1, Scale: 1}},
		Refs:    []steer.Ref{{Name: "x", Strength: 1}, {Name: "y", Strength: 1}},
		Clamps:  []steer.Clamp{{Hook: "c", Layer: 0, Strength: 1}, {Hook: "c", Layer: 0, Strength: 0.5}, {Hook: "c", Layer: 1}},
	}}
	add := steer.Steering{Base: steer.Tier{
		Vectors: []steer.Vector{{Hook: "a", Layer: 1, Scale: 2}},
		Refs:    []steer.Ref{{Name: "y", Strength: 3}},
		Clamps:  []steer.Clamp{{Hook: "c", Layer: 0, Strength: 0.25}},
	}, Decode: steer.Tier{Vectors: []steer.Vector{{Hook: "a", Layer: 0, Scale: 4}}}}
	got := steer.MergeSites(cur.Clone(), add)
	require.Equal(t, []steer.Vector{{Hook: "a", Layer: 0, Scale: 1}, {Hook: "a", Layer: 1, Scale: 2}}, got.Base.Vectors)
	require.Equal(t, []steer.Ref{{Name: "x", Strength: 1}, {Name: "y", Strength: 3}}, got.Base.Refs)
	require.Equal(t, []steer.Clamp{{Hook: "c", Layer: 1}, {Hook: "c", Layer: 0, Strength: 0.25}}, got.Base.Clamps)
	require.Len(t, got.Decode.Vectors, 1)
	j, _ := json.Marshal(got)
	require.NotEmpty(t, j)
}

// noDecoderInternals fails if an error shown to a client carries Go's decoder wording.
func noDecoderInternals(t *testing.T, err error) {
	for _, bad := range []string{"json: ", "Go struct", "Go value", "json.RawMessage", "serve."} {
		if strings.Contains(err.Error(), bad) {
			t.Fatalf("error leaks decoder internals (%q): %v", bad, err)
		}
	}
}
