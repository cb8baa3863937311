package shmlayout

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"unicode"
)

// toC translates the reader's source (reader.go.in) into C: one static inline function per Go
// function, in the same order, with the same statements. It knows only the subset the source
// is written in and refuses anything else, so a construct whose C meaning could differ from
// its Go meaning never gets through:
//   - parameters: uint64 (uint64_t), []byte (a pointer and a length: key, key_len), *rmem (the
//     reader descriptor, const void *);
//   - results: none, one (uint64 or bool), or several named uint64s (the first returned, the
//     rest through pointers);
//   - statements: :=, var of uint64s, =, op=, ++, if/else, for (three-clause or condition),
//     break, continue, return, calls, and a []byte parameter resliced from a literal offset
//     (key = key[16:]: pointer and length move);
//   - expressions: uint64 arithmetic, bitwise and comparison operators (every binary operation
//     parenthesised, so Go's precedence holds; &^ and unary ^ become & ~ and ~), integer
//     literals (UINT64_C), the table's constants (their SHM_ macros), conversions uint64(x) and
//     uint32(x), len of a []byte parameter, a []byte parameter's byte at an index, m.f (the
//     descriptor's row dF) and m.seeds[k], and calls to the source's functions and the
//     primitives, every one prefixed shm_ in C.
func toC(src string, consts map[string]string) (string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "reader.go.in", src, parser.ParseComments)
	if err != nil {
		return "", fmt.Errorf("shmlayout: reader.go.in: %w", err)
	}
	t := &translator{fset: fset, consts: consts, funcs: map[string]*ast.FuncDecl{}}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Recv != nil {
			return "", t.errf(d, "only plain functions are translated")
		}
		t.funcs[fd.Name.Name] = fd
	}
	for _, d := range f.Decls {
		if err := t.fn(d.(*ast.FuncDecl)); err != nil {
			return "", err
		}
	}
	// Prototypes first: the source's functions may call each other in any order, as in Go.
	return strings.Join(t.protos, ";\n") + ";\n" + t.out.String(), nil
}

// primTypes are the C types of the primitives' results that are not uint64 (Go's compiler
// checks that the source uses them as what they are: it compiles the same text).
var primTypes = map[string]string{"blobAt": "const uint64_t *"}

type translator struct {
	fset   *token.FileSet
	consts map[string]string // Go constant name -> C macro
	funcs  map[string]*ast.FuncDecl
	out    strings.Builder
	protos []string

	// per function
	slices  map[string]bool // []byte parameters
	mem     string          // the *rmem parameter's name, if any
	outs    []string        // result names after the first (C pointer parameters)
	locals  map[string]bool
	results int
}

func (t *translator) errf(n ast.Node, format string, args ...any) error {
	return fmt.Errorf("shmlayout: %s: "+format, append([]any{t.fset.Position(n.Pos())}, args...)...)
}

func (t *translator) fn(fd *ast.FuncDecl) error {
	t.slices, t.mem, t.outs, t.locals = map[string]bool{}, "", nil, map[string]bool{}
	if fd.Doc != nil {
		t.out.WriteString("\n/* " + strings.ReplaceAll(strings.TrimSpace(fd.Doc.Text()), "\n", "\n * ") + " */\n")
	}
	var params []string
	for _, p := range fd.Type.Params.List {
		for _, n := range p.Names {
			t.locals[n.Name] = true
			switch ty := exprString(p.Type); ty {
			case "uint64":
				params = append(params, "uint64_t "+n.Name)
			case "[]byte":
				t.slices[n.Name] = true
				params = append(params, "const unsigned char *"+n.Name, "uint64_t "+n.Name+"_len")
			case "*rmem":
				t.mem = n.Name
				params = append(params, "const void *"+n.Name)
			default:
				return t.errf(p, "parameter type %s", ty)
			}
		}
	}
	ret := "void"
	t.results = 0
	if r := fd.Type.Results; r != nil {
		var names []string
		for _, f := range r.List {
			ty := exprString(f.Type)
			if ty != "uint64" && !(ty == "bool" && len(r.List) == 1 && len(f.Names) == 0) {
				return t.errf(f, "result type %s", ty)
			}
			if len(f.Names) == 0 {
				names = append(names, "")
			}
			for _, n := range f.Names {
				names = append(names, n.Name)
			}
			if ty == "bool" {
				ret = "int"
			} else {
				ret = "uint64_t"
			}
		}
		if len(names) > 1 {
			for _, n := range names[1:] {
				if n == "" {
					return t.errf(r, "several results must be named")
				}
				t.outs = append(t.outs, n)
				params = append(params, "uint64_t *"+n)
			}
		}
		t.results = len(names)
	}
	proto := fmt.Sprintf("static inline %s shm_%s(%s)", ret, fd.Name.Name, strings.Join(params, ", "))
	t.protos = append(t.protos, proto)
	t.out.WriteString(proto + " {\n")
	if err := t.block(fd.Body.List, 1); err != nil {
		return err
	}
	t.out.WriteString("}\n")
	return nil
}

func (t *translator) block(list []ast.Stmt, depth int) error {
	for _, s := range list {
		if err := t.stmt(s, depth); err != nil {
			return err
		}
	}
	return nil
}

func (t *translator) line(depth int, s string) {
	t.out.WriteString(strings.Repeat("  ", depth) + s + "\n")
}

func (t *translator) stmt(s ast.Stmt, depth int) error {
	switch s := s.(type) {
	case *ast.AssignStmt:
		c, err := t.simple(s)
		if err != nil {
			return err
		}
		t.line(depth, c+";")
	case *ast.IncDecStmt:
		c, err := t.simple(s)
		if err != nil {
			return err
		}
		t.line(depth, c+";")
	case *ast.DeclStmt:
		g, ok := s.Decl.(*ast.GenDecl)
		if !ok || g.Tok != token.VAR {
			return t.errf(s, "only var declarations")
		}
		for _, sp := range g.Specs {
			vs := sp.(*ast.ValueSpec)
			if exprString(vs.Type) != "uint64" || len(vs.Values) != 0 {
				return t.errf(s, "var of uint64s without values only")
			}
			var names []string
			for _, n := range vs.Names {
				t.locals[n.Name] = true
				names = append(names, n.Name+" = 0")
			}
			t.line(depth, "uint64_t "+strings.Join(names, ", ")+";")
		}
	case *ast.ExprStmt:
		c, err := t.expr(s.X)
		if err != nil {
			return err
		}
		if _, ok := s.X.(*ast.CallExpr); !ok {
			return t.errf(s, "an expression statement that is not a call")
		}
		t.line(depth, c+";")
	case *ast.IfStmt:
		return t.ifStmt(s, depth, "")
	case *ast.ForStmt:
		var init, cond, post string
		var err error
		if s.Init != nil {
			if init, err = t.simple(s.Init); err != nil {
				return err
			}
		}
		if s.Cond != nil {
			if cond, err = t.expr(s.Cond); err != nil {
				return err
			}
		}
		if s.Post != nil {
			if post, err = t.simple(s.Post); err != nil {
				return err
			}
		}
		t.line(depth, fmt.Sprintf("for (%s; %s; %s) {", init, cond, post))
		if err := t.block(s.Body.List, depth+1); err != nil {
			return err
		}
		t.line(depth, "}")
	case *ast.BranchStmt:
		if s.Label != nil || (s.Tok != token.BREAK && s.Tok != token.CONTINUE) {
			return t.errf(s, "only unlabelled break and continue")
		}
		t.line(depth, s.Tok.String()+";")
	case *ast.ReturnStmt:
		return t.ret(s, depth)
	case *ast.BlockStmt:
		t.line(depth, "{")
		if err := t.block(s.List, depth+1); err != nil {
			return err
		}
		t.line(depth, "}")
	default:
		return t.errf(s, "statement %T", s)
	}
	return nil
}

func (t *translator) ifStmt(s *ast.IfStmt, depth int, prefix string) error {
	if s.Init != nil {
		return t.errf(s, "if with an init statement")
	}
	cond, err := t.expr(s.Cond)
	if err != nil {
		return err
	}
	t.line(depth, prefix+"if ("+cond+") {")
	if err := t.block(s.Body.List, depth+1); err != nil {
		return err
	}
	switch e := s.Else.(type) {
	case nil:
		t.line(depth, "}")
	case *ast.IfStmt:
		return t.ifStmt(e, depth, "} else ")
	case *ast.BlockStmt:
		t.line(depth, "} else {")
		if err := t.block(e.List, depth+1); err != nil {
			return err
		}
		t.line(depth, "}")
	}
	return nil
}

// simple translates an assignment or increment, without its semicolon (for a for clause too).
func (t *translator) simple(s ast.Stmt) (string, error) {
	switch s := s.(type) {
	case *ast.IncDecStmt:
		x, err := t.expr(s.X)
		return x + s.Tok.String(), err
	case *ast.AssignStmt:
		if len(s.Lhs) != 1 || len(s.Rhs) != 1 {
			return "", t.errf(s, "one value per assignment")
		}
		id, ok := s.Lhs[0].(*ast.Ident)
		if !ok {
			return "", t.errf(s, "assignment to %s", exprString(s.Lhs[0]))
		}
		if sl, ok := s.Rhs[0].(*ast.SliceExpr); ok && t.slices[id.Name] && s.Tok == token.ASSIGN {
			// key = key[lo:]: the pointer moves on, the length shrinks.
			if x, ok := sl.X.(*ast.Ident); !ok || x.Name != id.Name || sl.Low == nil || sl.High != nil || sl.Slice3 {
				return "", t.errf(s, "a []byte parameter is only resliced from an offset of itself")
			}
			if _, ok := sl.Low.(*ast.BasicLit); !ok {
				return "", t.errf(s, "a reslice from a literal offset only")
			}
			lo, err := t.expr(sl.Low)
			if err != nil {
				return "", err
			}
			return id.Name + " += " + lo + ", " + id.Name + "_len -= " + lo, nil
		}
		rhs, err := t.expr(s.Rhs[0])
		if err != nil {
			return "", err
		}
		if isBool(s.Rhs[0], t.funcs) {
			return "", t.errf(s, "a bool variable")
		}
		switch s.Tok {
		case token.DEFINE:
			t.locals[id.Name] = true
			ty := "uint64_t"
			if c, ok := s.Rhs[0].(*ast.CallExpr); ok {
				if f, ok := c.Fun.(*ast.Ident); ok && primTypes[f.Name] != "" {
					ty = primTypes[f.Name]
				}
			}
			return ty + " " + id.Name + " = " + rhs, nil
		case token.ASSIGN, token.ADD_ASSIGN, token.SUB_ASSIGN, token.XOR_ASSIGN, token.OR_ASSIGN, token.AND_ASSIGN, token.SHL_ASSIGN, token.SHR_ASSIGN, token.MUL_ASSIGN:
			if !t.locals[id.Name] {
				return "", t.errf(s, "assignment to %s, not a local", id.Name)
			}
			return id.Name + " " + s.Tok.String() + " " + rhs, nil
		}
		return "", t.errf(s, "assignment %s", s.Tok)
	}
	return "", t.errf(s, "statement %T in a clause", s)
}

func (t *translator) ret(s *ast.ReturnStmt, depth int) error {
	if len(s.Results) == 0 {
		if t.results != 0 {
			return t.errf(s, "a bare return")
		}
		t.line(depth, "return;")
		return nil
	}
	if len(s.Results) == 1 && t.results > 1 {
		// return f(...) of a function with the same results: its out pointers are ours.
		call, ok := s.Results[0].(*ast.CallExpr)
		if !ok {
			return t.errf(s, "one value for %d results", t.results)
		}
		c, err := t.call(call, t.outs)
		if err != nil {
			return err
		}
		t.line(depth, "return "+c+";")
		return nil
	}
	if len(s.Results) != t.results {
		return t.errf(s, "%d values for %d results", len(s.Results), t.results)
	}
	vals := make([]string, len(s.Results))
	for i, r := range s.Results {
		c, err := t.expr(r)
		if err != nil {
			return err
		}
		vals[i] = c
	}
	var b strings.Builder
	for i, o := range t.outs {
		fmt.Fprintf(&b, "*%s = %s; ", o, vals[i+1])
	}
	t.line(depth, b.String()+"return "+vals[0]+";")
	return nil
}

func (t *translator) expr(e ast.Expr) (string, error) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.INT {
			return "", t.errf(e, "literal %s", e.Value)
		}
		return "UINT64_C(" + strings.ReplaceAll(e.Value, "_", "") + ")", nil
	case *ast.Ident:
		switch {
		case t.locals[e.Name] && !t.slices[e.Name] && e.Name != t.mem:
			return e.Name, nil
		case e.Name == "true":
			return "1", nil
		case e.Name == "false":
			return "0", nil
		case t.consts[e.Name] != "":
			return t.consts[e.Name], nil
		}
		return "", t.errf(e, "unknown name %s (or a slice or *rmem used as a value)", e.Name)
	case *ast.ParenExpr:
		return t.expr(e.X)
	case *ast.UnaryExpr:
		x, err := t.expr(e.X)
		if err != nil {
			return "", err
		}
		switch e.Op {
		case token.XOR:
			return "(~" + x + ")", nil
		case token.NOT:
			return "(!" + x + ")", nil
		}
		return "", t.errf(e, "unary %s", e.Op)
	case *ast.BinaryExpr:
		x, err := t.expr(e.X)
		if err != nil {
			return "", err
		}
		y, err := t.expr(e.Y)
		if err != nil {
			return "", err
		}
		switch e.Op {
		case token.AND_NOT:
			return "(" + x + " & ~" + y + ")", nil
		case token.ADD, token.SUB, token.MUL, token.QUO, token.REM, token.AND, token.OR, token.XOR, token.SHL, token.SHR,
			token.EQL, token.NEQ, token.LSS, token.LEQ, token.GTR, token.GEQ, token.LAND, token.LOR:
			return "(" + x + " " + e.Op.String() + " " + y + ")", nil
		}
		return "", t.errf(e, "operator %s", e.Op)
	case *ast.SelectorExpr:
		if id, ok := e.X.(*ast.Ident); !ok || id.Name != t.mem || t.mem == "" {
			return "", t.errf(e, "a field of something other than the *rmem parameter")
		}
		return t.field(e, e.Sel.Name, "")
	case *ast.IndexExpr:
		i, err := t.expr(e.Index)
		if err != nil {
			return "", err
		}
		if id, ok := e.X.(*ast.Ident); ok && t.slices[id.Name] {
			return "(uint64_t)" + id.Name + "[" + i + "]", nil
		}
		if sel, ok := e.X.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == t.mem && t.mem != "" {
				return t.field(e, sel.Sel.Name, i)
			}
		}
		return "", t.errf(e, "indexing %s", exprString(e.X))
	case *ast.CallExpr:
		return t.call(e, nil)
	}
	return "", t.errf(e, "expression %T", e)
}

// field is the descriptor word of m's field name (row d<Name>), or its word at index i.
func (t *translator) field(n ast.Node, name, i string) (string, error) {
	row := "d" + string(unicode.ToUpper(rune(name[0]))) + name[1:]
	c := t.consts[row]
	if c == "" {
		return "", t.errf(n, "field %s has no descriptor row %s", name, row)
	}
	if i != "" {
		return "SHM_DW(" + t.mem + ", (" + c + " + 8 * (" + i + ")))", nil
	}
	return "SHM_DW(" + t.mem + ", " + c + ")", nil
}

// call translates a call; outs are out pointers passed on to a function with several results.
func (t *translator) call(e *ast.CallExpr, outs []string) (string, error) {
	id, ok := e.Fun.(*ast.Ident)
	if !ok {
		return "", t.errf(e, "a call of %s", exprString(e.Fun))
	}
	if e.Ellipsis != token.NoPos {
		return "", t.errf(e, "a variadic call")
	}
	switch id.Name {
	case "uint64", "uint32":
		if len(e.Args) != 1 {
			return "", t.errf(e, "a conversion of %d values", len(e.Args))
		}
		x, err := t.expr(e.Args[0])
		return "(" + id.Name + "_t)(" + x + ")", err
	case "len":
		if a, ok := e.Args[0].(*ast.Ident); ok && t.slices[a.Name] {
			return a.Name + "_len", nil
		}
		return "", t.errf(e, "len of something other than a []byte parameter")
	}
	if fd := t.funcs[id.Name]; fd != nil {
		n := 0
		if fd.Type.Results != nil {
			n = fd.Type.Results.NumFields()
		}
		if (n > 1) != (outs != nil) {
			return "", t.errf(e, "%s has %d results: call it only in a return of the same results", id.Name, n)
		}
	}
	var args []string
	for _, a := range e.Args {
		if id, ok := a.(*ast.Ident); ok && t.slices[id.Name] {
			args = append(args, id.Name, id.Name+"_len")
			continue
		}
		if id, ok := a.(*ast.Ident); ok && id.Name == t.mem && t.mem != "" {
			args = append(args, id.Name)
			continue
		}
		c, err := t.expr(a)
		if err != nil {
			return "", err
		}
		args = append(args, c)
	}
	return "shm_" + id.Name + "(" + strings.Join(append(args, outs...), ", ") + ")", nil
}

// isBool reports whether e is a comparison, a logical operation, or a call of a source function
// returning bool: C would give it another type than Go.
func isBool(e ast.Expr, funcs map[string]*ast.FuncDecl) bool {
	switch e := e.(type) {
	case *ast.ParenExpr:
		return isBool(e.X, funcs)
	case *ast.BinaryExpr:
		switch e.Op {
		case token.EQL, token.NEQ, token.LSS, token.LEQ, token.GTR, token.GEQ, token.LAND, token.LOR:
			return true
		}
	case *ast.UnaryExpr:
		return e.Op == token.NOT
	case *ast.CallExpr:
		if id, ok := e.Fun.(*ast.Ident); ok {
			if fd := funcs[id.Name]; fd != nil && fd.Type.Results != nil && exprString(fd.Type.Results.List[0].Type) == "bool" {
				return true
			}
			return id.Name == "keyAt"
		}
	}
	return false
}

func exprString(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.ArrayType:
		if e.Len == nil {
			return "[]" + exprString(e.Elt)
		}
	case *ast.StarExpr:
		return "*" + exprString(e.X)
	case *ast.SelectorExpr:
		return exprString(e.X) + "." + e.Sel.Name
	}
	return fmt.Sprintf("%T", e)
}
