package serve

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

// --auth comes from the flag, the TOML file and SHMSTEER_AUTH like every setting; the default
// is keys (closed).
func TestAuthConfig(t *testing.T) {
	load := func(args []string, env map[string]string) (Config, error) {
		fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
		BindFlags(fs)
		require.NoError(t, fs.Parse(args))
		return Load(fs, func(k string) string { return env[k] })
	}
	c, err := load(nil, nil)
	require.NoError(t, err)
	require.Equal(t, AuthKeys, c.Auth)
	c, err = load([]string{"--auth", "fork"}, nil)
	require.NoError(t, err)
	require.Equal(t, AuthFork, c.Auth)
	c, err = load(nil, map[string]string{"SHMSTEER_AUTH": "fork"})
	require.NoError(t, err)
	require.Equal(t, AuthFork, c.Auth)
	file := filepath.Join(t.TempDir(), "c.toml")
	require.NoError(t, os.WriteFile(file, []byte("auth = \"fork\"\n"), 0o600))
	c, err = load([]string{"--config", file}, nil)
	require.NoError(t, err)
	require.Equal(t, AuthFork, c.Auth)
	c, err = load([]string{"--config", file, "--auth", "keys"}, nil)
	require.NoError(t, err)
	require.Equal(t, AuthKeys, c.Auth, "the flag wins over the file")
	_, err = load([]string{"--auth", "open"}, nil)
	require.ErrorIs(t, err, ErrConfig)
}

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8677": true, "127.9.9.9:1": true, "[::1]:80": true, "localhost:0": true, "unix:/run/s.sock": true,
		"0.0.0.0:8677": false, ":8677": false, "10.0.0.1:80": false, "[::]:80": false, "example.com:80": false, "nonsense": false,
	} {
		require.Equal(t, want, isLoopback(addr), addr)
	}
}

// --auth fork with no key on an address others can reach is refused at start; with a key it
// starts (the refusal is about an open API, not about the address).
func TestAuthForkRefusedOpenOnNetwork(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.Namespace = "fork-open-refused"
	cfg.Hidden, cfg.Layers, cfg.ArenaBytes, cfg.IndexSlots = 8, 2, 1<<20, 64
	cfg.HTTP, cfg.Auth = "0.0.0.0:0", AuthFork
	err := Run(context.Background(), cfg, io.Discard, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.ErrorIs(t, err, ErrConfig)
	require.Contains(t, err.Error(), "--api-key-file")
	require.Contains(t, err.Error(), "0.0.0.0:0")

	cfg.APIKeyFile = filepath.Join(dir, "keys")
	require.NoError(t, os.WriteFile(cfg.APIKeyFile, []byte(forkToken+"\n"), 0o600))
	require.NoError(t, checkForkAuth(cfg, 1, 0))
	cfg.Auth = AuthKeys
	require.NoError(t, checkForkAuth(cfg, 0, 0), "the default mode is closed without keys: nothing to refuse")
	require.NoError(t, checkForkAuth(cfg, 2, 1), "the default mode keeps tenants apart")
}

// --auth fork with tenant keys is refused at start: its open routes run callers without a
// key, or with a wrong one, unscoped (they overwrote acme/polite and read every tenant's
// status). A SIGHUP bringing tenant keys keeps the old keys.
func TestAuthForkRefusesTenantKeys(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.Namespace = "fork-tenants-refused"
	cfg.Hidden, cfg.Layers, cfg.ArenaBytes, cfg.IndexSlots = 8, 2, 1<<20, 64
	cfg.HTTP, cfg.Auth = "127.0.0.1:0", AuthFork
	cfg.APIKeyFile = filepath.Join(dir, "keys")
	require.NoError(t, os.WriteFile(cfg.APIKeyFile, []byte(forkToken+"\nacme:"+forkToken2+"\n"), 0o600))
	err := Run(context.Background(), cfg, io.Discard, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.ErrorIs(t, err, ErrForkTenants)
	require.Contains(t, err.Error(), "1 tenant key")
	require.Contains(t, err.Error(), "--auth keys")
	require.NotContains(t, err.Error(), forkToken2, "never the key")

	s := &Server{cfg: cfg}
	require.NoError(t, os.WriteFile(cfg.APIKeyFile, []byte(forkToken+"\n"), 0o600))
	n, err := s.reloadKeys()
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, os.WriteFile(cfg.APIKeyFile, []byte("acme:"+forkToken2+"\n"), 0o600))
	_, err = s.reloadKeys()
	require.ErrorIs(t, err, ErrForkTenants)
	require.Equal(t, 0, s.keys.tenants(), "the old keys stay")
}

// With keys, --auth fork guards the mutations the fork guards (and serve's admissions) and
// leaves reads and the vector registry open. The default mode refuses every /v1/ call without
// a key.
func TestAuthForkModes(t *testing.T) {
	f := startForkServer(t, "fork-auth-modes", []string{forkToken, forkToken2})
	bearer := "Authorization: Bearer " + forkToken
	one := packHook(map[int][]float64{0: row(1)}, "float32", nil)
	for _, tc := range []struct {
		method, path string
		body         any
		header       string
		code         int
	}{
		{"GET", "/v1/steering", nil, "", 200},
		{"GET", "/v1/steering/layers", nil, "", 200},
		{"GET", "/v1/steering/dynamic", nil, "", 200},
		{"GET", "/v1/steering/vectors", nil, "", 200},
		{"GET", "/v1/steering/modules", nil, "", 200},
		{"GET", "/v1/status", nil, "", 200},
		{"POST", "/v1/steering/vectors/register", map[string]any{"name": "v", "kind": "steer", "packed": map[string]any{hp: one}}, "", 200},
		{"POST", "/v1/steering/vectors/register", map[string]any{"name": "v", "kind": "steer", "packed": map[string]any{hp: one}}, "Authorization: Bearer not-a-key-0123456789", 200},
		{"POST", "/v1/steering/vectors/unregister", map[string]any{"name": "v", "kind": "steer"}, "", 200},
		{"POST", "/v1/steering/set", vecs(map[string]any{"0": row(1)}), "", 401},
		{"POST", "/v1/steering/set", vecs(map[string]any{"0": row(1)}), "Authorization: Bearer not-a-key-0123456789", 401},
		{"POST", "/v1/steering/set", vecs(map[string]any{"0": row(1)}), bearer, 200},
		{"POST", "/v1/steering/clear", nil, "", 401},
		{"POST", "/v1/steering/modules/register", map[string]any{"name": "m", "vectors": map[string]any{hp: map[string]any{"0": row(1)}}}, "", 401},
		{"POST", "/v1/steering/modules/unregister", map[string]any{"name": "m"}, "", 401},
		{"POST", "/v1/requests/admit", map[string]any{"request_id": "r"}, "", 401},
		{"POST", "/v1/requests/end", map[string]any{"request_id": "r"}, "", 401},
		{"DELETE", "/v1/conversations/t/c", nil, "", 401},
		{"POST", "/v1/requests/admit", map[string]any{"request_id": "r"}, bearer, 200},
	} {
		var h []string
		if tc.header != "" {
			h = append(h, tc.header)
		}
		code, m := f.call(t, tc.method, tc.path, tc.body, h...)
		require.Equal(t, tc.code, code, "%s %s %q: %v", tc.method, tc.path, tc.header, m)
	}
	require.Contains(t, f.active(t), "0", "only the keyed set applied")

	// The default mode: closed.
	ts := startTestServer(t, "fork-auth-default", nil)
	for _, path := range []string{"/v1/steering", "/v1/steering/vectors", "/v1/steering/layers"} {
		code, m := ts.do("", "GET", path, "")
		require.Equal(t, 401, code, "%s: %v", path, m)
	}
	code, _ := ts.do("", "POST", "/v1/steering/vectors/register", `{"name":"v","kind":"steer","packed":{}}`)
	require.Equal(t, 401, code)
}
