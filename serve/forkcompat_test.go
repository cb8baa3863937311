package serve

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A body with a NaN (or ±Infinity) token: the fork's json.loads takes it and the fork answers
// 400 non-finite; serve answers the same (type non_finite), not "body is not valid JSON", and
// changes nothing. A body broken elsewhere keeps its syntax error.
func TestForkNonFiniteTokens(t *testing.T) {
	f := startForkServer(t, "fork-nan", nil)
	zeros := "0,0,0,0,0,0,0"
	for _, tc := range []struct{ path, body string }{
		{"/v1/steering/set", `{"vectors":{"` + hp + `":{"0":[NaN,` + zeros + `]}}}`},
		{"/v1/steering/set", `{"vectors":{"` + hp + `":{"0":{"vector":[1,` + zeros + `],"scale":Infinity}}}}`},
		{"/v1/steering/set", `{"decode_vectors":{"` + hp + `":{"1":[-Infinity,` + zeros + `]}}}`},
		{"/v1/steering/modules/register", `{"name":"m","vectors":{"` + hp + `":{"0":[NaN,` + zeros + `]}}}`},
	} {
		m := f.fails(t, tc.path, tc.body, 400, "non-finite")
		require.Contains(t, m["error"], "must be finite", tc.body)
		require.Equal(t, "non_finite", m["type"], tc.body)
		require.NotContains(t, m["error"], "not valid JSON")
	}
	require.Empty(t, f.active(t), "nothing applied")
	_, mods := f.get(t, "/v1/steering/modules")
	require.NotContains(t, mods["modules"], "m")

	m := f.fails(t, "/v1/steering/set", `{"vectors":{"`+hp+`":{"0":[NaN,`+zeros+`]}}`, 400, "not valid JSON")
	require.NotContains(t, m["error"], "non-finite", "broken anyway: the syntax error")
	f.fails(t, "/v1/steering/set", `{"vectors":{"NaN":{"0":[1,`+zeros+`]}}}`, 400, "hook") // a string, not a token

	tok, off, ok := nonFiniteToken([]byte(`{"a":"NaN \" Infinity","b":[1,-Infinity]}`))
	require.True(t, ok)
	require.Equal(t, "-Infinity", tok)
	require.Equal(t, strings.Index(`{"a":"NaN \" Infinity","b":[1,-Infinity]}`, "-Inf"), off)
}

// GET /v1/steering/vectors answers the fork's exact {vectors, count}; serve's details come with
// ?details=1.
func TestForkListVectorsBody(t *testing.T) {
	f := startForkServer(t, "fork-list", nil)
	f.ok(t, "/v1/steering/vectors/register", map[string]any{"name": "v", "kind": "steer", "packed": map[string]any{hp: packHook(map[int][]float64{0: row(1)}, "float32", nil)}})
	_, m := f.get(t, "/v1/steering/vectors")
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	require.Equal(t, []string{"count", "vectors"}, keys)
	require.EqualValues(t, 1, m["count"])
	_, m = f.get(t, "/v1/steering/vectors?details=1")
	require.Len(t, m["details"], 1)
	require.Equal(t, "v", m["details"].([]any)[0].(map[string]any)["name"])
}
