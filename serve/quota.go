package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// ErrQuota means a tenant's key would take its tenant past one of its quotas
// (tenant_max_vectors, tenant_max_vector_bytes); the message names it and the use. Remove some
// of the tenant's vectors or raise the quota.
var ErrQuota = errors.New("shmsteer: tenant quota exceeded")

// tenantVectors counts the named vectors (steering and probe) of tenant ("tenant/..." names)
// and the bytes of their encodings, leaving out except of kind exceptKind (about to be
// replaced).
func (s *Server) tenantVectors(tenant string, exceptKind shm.Kind, except string) (n int, bytes int64, err error) {
	snap, err := s.eng.Region().Snapshot()
	if err != nil {
		return 0, 0, err
	}
	defer snap.Close()
	prefix := tenant + "/"
	for _, kind := range []shm.Kind{steer.KindVector, steer.KindProbe} {
		err := snap.Range(kind, func(key, value []byte, _ uint64) bool {
			if name := string(key); strings.HasPrefix(name, prefix) && (kind != exceptKind || name != except) {
				n++
				bytes += int64(len(value))
			}
			return true
		})
		if err != nil {
			return 0, 0, err
		}
	}
	return n, bytes, nil
}

// checkVectorQuota refuses, for a tenant's key, registering vecs under name if the tenant
// would then hold more than tenant_max_vectors named vectors or tenant_max_vector_bytes of
// their encodings (a replaced vector's old version does not count). Callers hold s.mu, so API
// writes cannot race past it; workers' writes are not the tenants'.
func (s *Server) checkVectorQuota(p principal, kind steer.VectorKind, name string, vecs []steer.Vector) error {
	if p.admin() {
		return nil
	}
	k := steer.KindVector
	if kind == steer.VectorProbe {
		k = steer.KindProbe
	}
	n, bytes, err := s.tenantVectors(p.tenant, k, name)
	if err != nil {
		return err
	}
	enc, _, err := steer.EncodeSteering(&steer.Steering{Base: steer.Tier{Vectors: vecs}}, s.eng.Config())
	if err != nil {
		return err
	}
	switch {
	case n+1 > s.cfg.TenantMaxVectors:
		return fmt.Errorf("%w: tenant %q holds %d named vectors, tenant_max_vectors is %d: unregister some first", ErrQuota, p.tenant, n, s.cfg.TenantMaxVectors)
	case bytes+int64(len(enc)) > s.cfg.TenantMaxVectorBytes:
		return fmt.Errorf("%w: tenant %q holds %d bytes of named vectors and this one is %d, tenant_max_vector_bytes is %d: unregister some first",
			ErrQuota, p.tenant, bytes, len(enc), s.cfg.TenantMaxVectorBytes)
	}
	return nil
}

// tenantCaptureBytes sums the stored capture entries (steer.KindCapture: the specs of admitted
// requests not yet ended) of tenant's request ids ("tenant/...").
func (s *Server) tenantCaptureBytes(tenant string) (int64, error) {
	snap, err := s.eng.Region().Snapshot()
	if err != nil {
		return 0, err
	}
	defer snap.Close()
	prefix := tenant + "/"
	var bytes int64
	err = snap.Range(steer.KindCapture, func(key, value []byte, _ uint64) bool {
		if strings.HasPrefix(string(key), prefix) {
			bytes += int64(len(value))
		}
		return true
	})
	return bytes, err
}

// checkCaptureQuota refuses, for a tenant's key, an admission whose capture specs (raw bytes,
// as stored) would take the tenant's stored specs past tenant_max_capture_bytes. Callers hold
// s.capMu, so admissions with capture cannot race past it.
func (s *Server) checkCaptureQuota(p principal, specs map[string]json.RawMessage) error {
	if p.admin() || len(specs) == 0 {
		return nil
	}
	var add int64
	for _, sp := range specs {
		add += int64(len(sp))
	}
	held, err := s.tenantCaptureBytes(p.tenant)
	if err != nil {
		return err
	}
	if held+add > s.cfg.TenantMaxCaptureBytes {
		return fmt.Errorf("%w: tenant %q's requests not yet ended hold %d bytes of capture specs and this admission's are %d, tenant_max_capture_bytes is %d: end some requests first",
			ErrQuota, p.tenant, held, add, s.cfg.TenantMaxCaptureBytes)
	}
	return nil
}

// admitCounted admits a; a tenant's admission with capture specs is checked against its
// capture quota first, the count and the admission that adds to it one at a time.
func (s *Server) admitCounted(p principal, a steer.Admission) (steer.Admitted, error) {
	if len(a.Capture) > 0 && !p.admin() {
		s.capMu.Lock()
		defer s.capMu.Unlock()
		if err := s.checkCaptureQuota(p, a.Capture); err != nil {
			return steer.Admitted{}, err
		}
	}
	return s.eng.Admit(a)
}

// tenantStatus is GET /v1/status for a tenant's key: its own counts and quotas, nothing of the
// namespace, the state directory or other tenants.
type tenantStatus struct {
	Tenant               string `json:"tenant"`
	LatchedConversations int    `json:"latched_conversations"`
	LatchedBytes         int64  `json:"latched_bytes"`
	NamedVectors         int    `json:"named_vectors"`
	NamedVectorBytes     int64  `json:"named_vector_bytes"`
	Modules              int    `json:"modules"`
	MaxLatches           int    `json:"tenant_max_latches"`
	MaxLatchedBytes      int64  `json:"tenant_max_latched_bytes"`
	MaxVectors           int    `json:"tenant_max_vectors"`
	MaxVectorBytes       int64  `json:"tenant_max_vector_bytes"`
	CaptureBytes         int64  `json:"capture_bytes"`
	MaxCaptureBytes      int64  `json:"tenant_max_capture_bytes"`
}

// statusFor is GET /v1/status: the whole statusReply for an admin key, the tenant's own for a
// tenant's key.
func (s *Server) statusFor(p principal) (any, error) {
	if p.admin() {
		return s.status()
	}
	out := tenantStatus{Tenant: p.tenant, MaxLatches: s.cfg.TenantMaxLatches, MaxLatchedBytes: s.cfg.TenantMaxLatchedBytes,
		MaxVectors: s.cfg.TenantMaxVectors, MaxVectorBytes: s.cfg.TenantMaxVectorBytes, MaxCaptureBytes: s.cfg.TenantMaxCaptureBytes}
	out.LatchedConversations, out.LatchedBytes = s.eng.Latches().TenantUse(p.tenant)
	var err error
	if out.NamedVectors, out.NamedVectorBytes, err = s.tenantVectors(p.tenant, 0, ""); err != nil {
		return nil, err
	}
	if out.CaptureBytes, err = s.tenantCaptureBytes(p.tenant); err != nil {
		return nil, err
	}
	s.mu.Lock()
	for name := range s.modules {
		if p.owns(name) {
			out.Modules++
		}
	}
	s.mu.Unlock()
	return out, nil
}
