package serve

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/stretchr/testify/require"
)

// Every user op of the table in internal/proto has a /metrics name (op 262 was labelled
// op="262"), and opNames names nothing else. The table is read from its source, so a new op
// fails here until it is named.
func TestOpNamesCoverTable(t *testing.T) {
	files, err := filepath.Glob("../internal/proto/*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	ops := map[uint16]string{}
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, 0)
		require.NoError(t, err)
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, sp := range gd.Specs {
				vs := sp.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if !strings.HasPrefix(name.Name, "Op") || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok {
						continue
					}
					v, err := strconv.ParseUint(lit.Value, 0, 16)
					require.NoError(t, err, name.Name)
					if op := uint16(v); op >= proto.MinUserOp && op <= proto.MaxUserOp && name.Name != "MinUserOp" {
						ops[op] = name.Name
					}
				}
			}
		}
	}
	require.Contains(t, ops, proto.OpGateEngaged, "the walk reads the table")
	names := map[string]bool{}
	for op, cname := range ops {
		n := opNames[op]
		require.NotEmpty(t, n, "%s (%d) has no /metrics name in opNames", cname, op)
		require.False(t, names[n], "%q names two ops", n)
		names[n] = true
	}
	for op := range opNames {
		require.Contains(t, ops, op, "opNames names op %d, which is not in the table", op)
	}
}
