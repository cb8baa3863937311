package serve

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
)

// printStatusValue prints one field of `shmsteer status` as "key<TAB>value" lines: an object
// (gate_work, capture, mirror) one line per leaf, its keys joined by dots
// (gate_work.evaluations.this_token), in key order; a list or an empty object as JSON; anything
// else as it is.
func printStatusValue(w io.Writer, key string, v any) {
	switch x := v.(type) {
	case map[string]any:
		if len(x) == 0 {
			fmt.Fprintf(w, "%s\t{}\n", key)
			return
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			printStatusValue(w, key+"."+k, x[k])
		}
	case []any:
		b, err := json.Marshal(x)
		if err != nil {
			fmt.Fprintf(w, "%s\t%v\n", key, x)
			return
		}
		fmt.Fprintf(w, "%s\t%s\n", key, b)
	default:
		fmt.Fprintf(w, "%s\t%v\n", key, v)
	}
}
