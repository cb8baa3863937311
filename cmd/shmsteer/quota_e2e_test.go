package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/ipc"
)

// Tenants do not share capacities (default quotas): a tenant that latches 1,024 conversations
// (max_conversations) evicts only its own latches, never another tenant's; a tenant's key may
// hold at most tenant_max_vectors named vectors (429 quota beyond); and GET /v1/status shows a
// tenant's key its own counts and quotas, not the namespace or the state directory. Before,
// the flood evicted every other tenant's latch, the vectors were all registered, and the
// status showed the whole server.
func TestServeTenantQuotas(t *testing.T) {
	s := startServe(t, ns(t), filepath.Join(t.TempDir(), "state"))
	admit := func(key, tenant string, i int) {
		t.Helper()
		code, m := s.call("POST", "/v1/requests/admit", key, map[string]any{"request_id": fmt.Sprintf("%s/r%d", tenant, i), "tenant": tenant,
			"conversation": fmt.Sprintf("c%d", i), "override": map[string]any{"vectors": map[string]any{"pre_attn": map[string]any{"0": vec(uint64(i))}}}})
		require.Equal(t, http.StatusOK, code, "%v", m)
		require.Equal(t, true, m["latched"], "%v", m)
	}
	for i := range 10 {
		admit(acmeKey, "acme", i)
	}
	for i := range 1024 {
		admit(otherKey, "other", i)
	}
	_, st := s.call("GET", "/v1/status", acmeKey, nil)
	require.EqualValues(t, 10, st["latched_conversations"], "acme keeps its latches: %v", st)
	_, st = s.call("GET", "/v1/status", otherKey, nil)
	require.EqualValues(t, 256, st["latched_conversations"], "other is held to tenant_max_latches: %v", st)
	require.EqualValues(t, 256, st["tenant_max_latches"])
	for _, k := range []string{"namespace", "state_dir", "named_vectors_total", "clients", "keys", "index_used", "api_keys"} {
		require.NotContains(t, st, k, "a tenant's status shows nothing of the server")
	}
	require.Equal(t, "other", st["tenant"])
	// A latch of acme bridges still.
	code, m := s.call("POST", "/v1/requests/admit", acmeKey, map[string]any{"request_id": "acme/again", "tenant": "acme", "conversation": "c3"})
	require.Equal(t, http.StatusOK, code, "%v", m)
	require.Equal(t, "latch", m["source"])

	reg := func(key, name string) (int, map[string]any) {
		return s.call("POST", "/v1/steering/vectors/register", key, map[string]any{"name": name, "kind": "steer",
			"packed": map[string]any{"pre_attn": packed("float32", []int{0}, [][]float32{vec(7)})}})
	}
	for i := range 256 {
		code, m := reg(acmeKey, fmt.Sprintf("acme/v%d", i))
		require.Equal(t, http.StatusOK, code, "%v", m)
	}
	code, m = reg(acmeKey, "acme/v256")
	require.Equal(t, http.StatusTooManyRequests, code, "%v", m)
	require.Equal(t, "quota", m["type"])
	require.Contains(t, m["error"], "tenant_max_vectors")
	code, m = reg(acmeKey, "acme/v3") // replacing one is within the quota
	require.Equal(t, http.StatusOK, code, "%v", m)
	code, m = reg(otherKey, "other/v0") // another tenant's quota is its own
	require.Equal(t, http.StatusOK, code, "%v", m)
	_, st = s.call("GET", "/v1/status", acmeKey, nil)
	require.EqualValues(t, 256, st["named_vectors"], "%v", st)
	full := s.ok("GET", "/v1/status", nil)
	require.Equal(t, s.ns, full["namespace"], "an admin key sees the whole status")
	require.NoError(t, s.stop(syscall.SIGTERM))
}

// `shmsteer vectors rm` (a worker, through the owner) of a vector the global steering
// references drops the references, says so, and later merging sets keep working. Before, the
// CLI said nothing and every later merging /v1/steering/set failed with "unknown named vector".
func TestCLIUnregisterReferencedByGlobal(t *testing.T) {
	s := startServe(t, ns(t), "")
	for _, n := range []string{"a", "b"} {
		s.ok("POST", "/v1/steering/vectors/register", map[string]any{"name": n, "kind": "steer",
			"packed": map[string]any{"pre_attn": packed("float32", []int{0}, [][]float32{vec(3)})}})
	}
	s.ok("POST", "/v1/steering/set", map[string]any{"vector_refs": map[string]float32{"a": 1, "b": 1}})
	cmd := exec.Command(binPath, "vectors", "rm", "a", "--namespace", s.ns)
	cmd.Env = append(os.Environ(), ipc.SecretEnv+"="+e2eSecret)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "references were dropped from: global")
	s.ok("POST", "/v1/steering/set", map[string]any{"vectors": map[string]any{"mlp_out": map[string]any{"1": vec(4)}}})
	m := s.ok("POST", "/v1/steering/vectors/unregister", map[string]any{"name": "b", "kind": "steer"})
	require.Equal(t, []any{"global"}, m["dropped_references"])
	require.NoError(t, s.stop(syscall.SIGTERM))
}
