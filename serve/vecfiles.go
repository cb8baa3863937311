package serve

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/shmsteer/shmsteer/steer"
	"github.com/shmsteer/shmsteer/steer/vecfile"
)

// Vector files through the control API: POST /v1/steering/vectors/import takes a GGUF control
// vector, .npy, .npz or safetensors file as the raw request body and registers it as a named
// vector; GET /v1/steering/vectors/{name}/export returns a named vector as such a file.

// vecfileErrors map package vecfile's sentinels to a status and an error type. They come
// before steer's in apiErrors: an import error also wraps steer's (a hidden-size mismatch is
// ErrShape and steer.ErrHiddenSize), and the file's view of it says more.
var vecfileErrors = []apiError{
	{vecfile.ErrTooLarge, http.StatusRequestEntityTooLarge, "too_large"},
	{vecfile.ErrUnknownFormat, http.StatusBadRequest, "unknown_format"},
	{vecfile.ErrBadOptions, http.StatusBadRequest, "bad_options"},
	{vecfile.ErrNeedLayers, http.StatusBadRequest, "need_layers"},
	{vecfile.ErrCorrupt, http.StatusUnprocessableEntity, "corrupt_file"},
	{vecfile.ErrDtype, http.StatusUnprocessableEntity, "dtype"},
	{vecfile.ErrShape, http.StatusUnprocessableEntity, "shape"},
	{vecfile.ErrValueRange, http.StatusUnprocessableEntity, "value_range"},
	{vecfile.ErrTensorName, http.StatusUnprocessableEntity, "tensor_name"},
	{vecfile.ErrNoVectors, http.StatusUnprocessableEntity, "no_vectors"},
	{vecfile.ErrUnrepresentable, http.StatusUnprocessableEntity, "unrepresentable"},
}

// importQuery are the query parameters of POST /v1/steering/vectors/import.
var importQuery = []string{"name", "scale", "layers", "hook", "format", "filename", "model_hint"}

// importOptions reads the query of an import: name (required), scale, layers "A-B" or "A",
// hook, format (gguf, npy, npz, safetensors; default: detected) and filename (used in errors
// and for detection by extension). Unknown parameters are refused.
func importOptions(r *http.Request, capBytes int64) (name, file string, opts vecfile.ImportOptions, err error) {
	q := r.URL.Query()
	for k := range q {
		if !slices.Contains(importQuery, k) {
			return "", "", opts, badInput("unknown query parameter %q (want %s)", k, strings.Join(importQuery, ", "))
		}
		if len(q[k]) > 1 {
			return "", "", opts, badInput("query parameter %q given %d times", k, len(q[k]))
		}
	}
	name = q.Get("name")
	if name == "" {
		return "", "", opts, badInput("name is missing: POST /v1/steering/vectors/import?name=NAME with the file as the body")
	}
	opts = vecfile.ImportOptions{Hook: q.Get("hook"), Format: vecfile.Format(strings.ToLower(q.Get("format"))), MaxBytes: capBytes}
	if s := q.Get("scale"); s != "" {
		f, err := strconv.ParseFloat(s, 32)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) || f == 0 {
			return "", "", opts, badInput("scale %q: want a finite, non-zero number", s)
		}
		opts.Scale = float32(f)
	}
	if s := q.Get("layers"); s != "" {
		lr, err := vecfile.ParseLayerRange(s)
		if err != nil {
			return "", "", opts, err
		}
		opts.Layers = &lr
	}
	file = q.Get("filename")
	if file == "" {
		file = "upload"
	}
	return name, file, opts, nil
}

// importVector is POST /v1/steering/vectors/import: the body is the file (raw bytes, any
// content type), read up to max_upload_bytes. It registers the vectors under name as
// /v1/steering/vectors/register does (same scoping; persisted before the reply).
func (s *Server) importVector(w http.ResponseWriter, r *http.Request, p principal) (any, error) {
	name, file, opts, err := importOptions(r, s.cfg.MaxUploadBytes)
	if err != nil {
		return nil, err
	}
	if !p.owns(name) {
		return nil, fmt.Errorf("%w: tenant %q may register only names starting with %q", ErrForbidden, p.tenant, p.tenant+"/")
	}
	// The cap is checked before reading when the client declares the length; ImportReader
	// stops one byte past it otherwise.
	if r.ContentLength == 0 {
		return nil, badInput("empty body: send the vector file's bytes (curl --data-binary @FILE; curl sends an empty body when FILE is missing)")
	}
	if r.ContentLength > s.cfg.MaxUploadBytes {
		return nil, fmt.Errorf("%w: %s is %d bytes, the cap is %d (max_upload_bytes)", vecfile.ErrTooLarge, file, r.ContentLength, s.cfg.MaxUploadBytes)
	}
	body, err := s.bodies.charge(r, p.tenant)
	if err != nil {
		return nil, err
	}
	defer body.release()
	var vecs []steer.Vector
	var hint string // the GGUF's controlvector.model_hint, stored with the vector
	if r.ContentLength >= 0 {
		// Read into a buffer of the declared size: no doubling copies of a large file.
		b := make([]byte, r.ContentLength)
		if _, err := io.ReadFull(body, b); err != nil {
			return nil, fmt.Errorf("%w: reading %s: %w", ErrBadInput, file, err)
		}
		vecs, err = vecfile.ImportBytes(b, file, s.eng.Config(), opts)
		hint = vecfile.ModelHint(b)
	} else {
		vecs, err = vecfile.ImportReader(body, file, s.eng.Config(), opts)
	}
	if err != nil {
		return nil, err
	}
	if q := r.URL.Query(); q.Has("model_hint") {
		hint = q.Get("model_hint") // given explicitly: it replaces the file's
		if err := steer.CheckModelHint(hint); err != nil {
			return nil, err
		}
	} else if err := steer.CheckModelHint(hint); err != nil {
		return nil, fmt.Errorf("%s's controlvector.model_hint: %w (give model_hint= to replace it)", file, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkVectorQuota(p, steer.VectorSteer, name, vecs); err != nil {
		return nil, err
	}
	info, err := s.eng.Register(name, vecs, steer.ModelHint(hint))
	if err != nil {
		return nil, err
	}
	if err := s.persistAfterChange(); err != nil {
		return nil, err
	}
	layers := make([]int, 0, len(vecs))
	hooks := []string{}
	for _, v := range vecs {
		layers = append(layers, v.Layer)
		hooks = append(hooks, v.Hook)
	}
	slices.Sort(layers)
	slices.Sort(hooks)
	return map[string]any{"status": "ok", "name": name, "kind": "steer", "version": info.Version,
		"digest": hex.EncodeToString(info.Digest[:]), "entries": len(vecs),
		"hook_points": slices.Compact(hooks), "layers": slices.Compact(layers), "model_hint": hint}, nil
}

var exportExt = map[vecfile.Format]string{vecfile.FormatGGUF: ".gguf", vecfile.FormatNpy: ".npy",
	vecfile.FormatNpz: ".npz", vecfile.FormatSafetensors: ".safetensors"}

// exportVector is GET /v1/steering/vectors/{name}/export?format=F (default safetensors, which
// holds any named vector): the file, as an attachment. A name with '/' (tenant/name) may be
// sent as is or as %2F. A tenant key sees only its own names (others are 404, as in listings).
func (s *Server) exportVector(w http.ResponseWriter, r *http.Request, p principal) (any, error) {
	name, ok := strings.CutSuffix(r.PathValue("rest"), "/export")
	if !ok || name == "" {
		return nil, fmt.Errorf("%w: no such endpoint or method", ErrNotFound)
	}
	q := r.URL.Query()
	for k := range q {
		if k != "format" && k != "model_hint" {
			return nil, badInput("unknown query parameter %q (want format, model_hint)", k)
		}
	}
	f := vecfile.Format(strings.ToLower(q.Get("format")))
	if f == vecfile.FormatAuto {
		f = vecfile.FormatSafetensors
	}
	ext, known := exportExt[f]
	if !known {
		return nil, fmt.Errorf("%w: format %q (want gguf, npy, npz or safetensors)", vecfile.ErrUnknownFormat, f)
	}
	if !p.owns(name) {
		return nil, fmt.Errorf("%w: steer vector %q", ErrNotFound, name)
	}
	snap, err := s.eng.Region().Snapshot()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	nv, err := s.eng.Vector(&snap, name)
	if err == nil {
		// The stored hint unless one is given (model_hint= writes none).
		var m steer.VectorMeta
		if m, err = s.eng.VectorMeta(&snap, name); q.Has("model_hint") {
			m.ModelHint = q.Get("model_hint")
		}
		// Written to a buffer first: a refusal (ErrUnrepresentable) is then a JSON error, not
		// a cut file. The snapshot keeps the vector's data valid until Export returns.
		if err == nil {
			err = vecfile.Export(&buf, f, s.eng.Config(), nv.Vectors, vecfile.ExportOptions{ModelHint: m.ModelHint})
		}
	}
	snap.Close()
	if errors.Is(err, steer.ErrUnknownVector) {
		return nil, fmt.Errorf("%w: steer vector %q", ErrNotFound, name)
	} else if err != nil {
		return nil, err
	}
	file := strings.NewReplacer("/", "_", `"`, "_", `\`, "_").Replace(name) + ext
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", file))
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(http.StatusOK)
	w.Write(buf.Bytes())
	return nil, nil
}
