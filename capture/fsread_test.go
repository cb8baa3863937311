package capture

// A reader of the filesystem consumer's layout written from the fork's documented format
// (docs/features/capture_consumers.md and the reference reader's docstring), not from this
// package's writer: read_request's rules, in Go.
//
//	per_file: {dir}/{layer}_{hook}.bin raw little-endian rows, {dir}/{layer}_{hook}.json
//	          {request_id, layer, hook, shape: [rows, width], dtype, positions}
//	packed:   {dir}/packed.bin, {dir}/packed.json {request_id, layout: "packed", dtype,
//	          entries: [{layer, hook, offset, nbytes, shape, positions}]}; a (layer, hook) may
//	          span several entries, concatenated in offset order.
//
// bfloat16 is raw uint16; the layout is packed when a packed*.json exists.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

type readEntry struct {
	dtype     string
	rows      int
	width     int
	data      []byte
	positions []int
}

var forkDtypeSize = map[string]int{"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "uint16": 2,
	"int8": 1, "uint8": 1, "int16": 2, "int32": 4, "int64": 8}

type forkKey struct {
	layer int
	hook  string
}

func readForkRequest(dir string) (map[forkKey]readEntry, error) {
	idx, _ := filepath.Glob(filepath.Join(dir, "packed*.json"))
	if len(idx) > 0 {
		return readForkPacked(idx)
	}
	bins, _ := filepath.Glob(filepath.Join(dir, "*.bin"))
	slices.Sort(bins)
	out := map[forkKey]readEntry{}
	for _, bin := range bins {
		if strings.HasPrefix(filepath.Base(bin), "packed") {
			continue
		}
		var side struct {
			Layer     *int   `json:"layer"`
			Hook      string `json:"hook"`
			Shape     []int  `json:"shape"`
			Dtype     string `json:"dtype"`
			Positions []int  `json:"positions"`
		}
		js, err := os.ReadFile(strings.TrimSuffix(bin, ".bin") + ".json")
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(js, &side); err != nil {
			return nil, err
		}
		if side.Dtype == "" {
			side.Dtype = "float32" // the reader's default for old sidecars
		}
		data, err := os.ReadFile(bin)
		if err != nil {
			return nil, err
		}
		if side.Layer == nil || len(side.Shape) != 2 || forkDtypeSize[side.Dtype] == 0 ||
			len(data) != side.Shape[0]*side.Shape[1]*forkDtypeSize[side.Dtype] {
			return nil, fmt.Errorf("%s: sidecar %s does not describe %d bytes", bin, js, len(data))
		}
		out[forkKey{*side.Layer, side.Hook}] = readEntry{side.Dtype, side.Shape[0], side.Shape[1], data, side.Positions}
	}
	return out, nil
}

func readForkPacked(indexes []string) (map[forkKey]readEntry, error) {
	out := map[forkKey]readEntry{}
	for _, ip := range indexes {
		var index struct {
			Layout  string `json:"layout"`
			Dtype   string `json:"dtype"`
			Entries []struct {
				Layer     int    `json:"layer"`
				Hook      string `json:"hook"`
				Offset    int    `json:"offset"`
				Nbytes    int    `json:"nbytes"`
				Shape     []int  `json:"shape"`
				Dtype     string `json:"dtype"`
				Positions []int  `json:"positions"`
			} `json:"entries"`
		}
		js, err := os.ReadFile(ip)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(js, &index); err != nil {
			return nil, err
		}
		raw, err := os.ReadFile(strings.TrimSuffix(ip, ".json") + ".bin")
		if err != nil {
			return nil, err
		}
		type part struct {
			off  int
			e    readEntry
			hasP bool
		}
		grouped := map[forkKey][]part{}
		for _, e := range index.Entries {
			dt := e.Dtype
			if dt == "" {
				dt = index.Dtype
			}
			if e.Offset < 0 || e.Nbytes < 0 || e.Offset+e.Nbytes > len(raw) {
				return nil, fmt.Errorf("packed bin truncated: entry (%d, %s) wants [%d:%d] of %d bytes", e.Layer, e.Hook, e.Offset, e.Offset+e.Nbytes, len(raw))
			}
			if len(e.Shape) != 2 || e.Shape[0]*e.Shape[1]*forkDtypeSize[dt] != e.Nbytes || forkDtypeSize[dt] == 0 {
				return nil, fmt.Errorf("entry (%d, %s): shape %v of %s is not %d bytes", e.Layer, e.Hook, e.Shape, dt, e.Nbytes)
			}
			k := forkKey{e.Layer, e.Hook}
			grouped[k] = append(grouped[k], part{e.Offset, readEntry{dt, e.Shape[0], e.Shape[1], raw[e.Offset : e.Offset+e.Nbytes], e.Positions}, e.Positions != nil})
		}
		for k, parts := range grouped {
			slices.SortFunc(parts, func(a, b part) int { return a.off - b.off })
			var r readEntry
			allP := true
			for _, p := range parts {
				if r.width != 0 && r.width != p.e.width {
					return nil, fmt.Errorf("entry (%d, %s): widths %d and %d do not concatenate", k.layer, k.hook, r.width, p.e.width)
				}
				r.dtype, r.width = p.e.dtype, p.e.width
				r.rows += p.e.rows
				r.data = append(r.data, p.e.data...)
				r.positions = append(r.positions, p.e.positions...)
				allP = allP && p.hasP
			}
			if !allP {
				r.positions = nil
			}
			out[k] = r
		}
	}
	return out, nil
}
