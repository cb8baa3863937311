package serve

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// A /set of references only names no sites of its own: empty lists, not null.
func TestSetRefsOnlyAnswersEmptyLists(t *testing.T) {
	ts := startTestServer(t, "refs-only", nil)
	ts.register(adminKey, "a")
	code, m := ts.do(adminKey, "POST", "/v1/steering/set", `{"vector_refs":{"a":1}}`)
	require.Equal(t, 200, code, "%v", m)
	require.Equal(t, []any{}, m["hook_points"])
	require.Equal(t, []any{}, m["layers_updated"])
	require.NoError(t, ts.close())
}

// An empty body says so; a body cut short says that instead.
func TestDescribeEmptyBody(t *testing.T) {
	var v map[string]any
	err := json.NewDecoder(bytes.NewReader(nil)).Decode(&v)
	require.Equal(t, "empty body: want one JSON object", describeJSONError(err))
	err = json.NewDecoder(bytes.NewReader([]byte(`{"vectors": `))).Decode(&v)
	require.Equal(t, "body ends early: want one JSON object", describeJSONError(err))
}
