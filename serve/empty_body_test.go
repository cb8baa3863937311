package serve

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// An empty body says so; a body cut short says that instead.
func TestDescribeEmptyBody(t *testing.T) {
	var v map[string]any
	err := json.NewDecoder(bytes.NewReader(nil)).Decode(&v)
	require.Equal(t, "empty body: want one JSON object", describeJSONError(err))
	err = json.NewDecoder(bytes.NewReader([]byte(`{"vectors": `))).Decode(&v)
	require.Equal(t, "body ends early: want one JSON object", describeJSONError(err))
}
