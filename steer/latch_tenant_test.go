package steer

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// Per-tenant latch caps: a tenant at MaxPerTenant or MaxTenantBytes evicts its own oldest
// latch, never another tenant's; conversations without a tenant have the global caps only; the
// counts follow drops and evictions.
func TestLatchPerTenantCaps(t *testing.T) {
	l := NewLatches(LatchConfig{MaxConversations: 8, MaxPerTenant: 3, MaxTenantBytes: 40})
	s := func(n int) *Steering {
		return &Steering{Base: Tier{Vectors: []Vector{{Hook: "pre_attn", Data: make([]float32, n)}}}}
	}
	key := func(tenant string, i int) ConvKey { return ConvKey{Tenant: tenant, ID: fmt.Sprint(i)} }
	for i := range 2 {
		require.True(t, l.Trigger(key("a", i), s(1), nil))
	}
	for i := range 5 {
		require.True(t, l.Trigger(key("b", i), s(1), nil))
	}
	n, b := l.TenantUse("a")
	require.Equal(t, 2, n)
	require.EqualValues(t, 8, b)
	n, _ = l.TenantUse("b")
	require.Equal(t, 3, n, "b evicted its own oldest")
	require.Equal(t, []ConvKey{key("a", 0), key("a", 1), key("b", 2), key("b", 3), key("b", 4)}, l.Keys())
	// Bytes: b's 3 latches hold 12 bytes; one of 8 floats (32 bytes) makes 40... then 44 > 40.
	require.True(t, l.Trigger(key("b", 5), s(8), nil))
	_, b = l.TenantUse("b")
	require.LessOrEqual(t, b, int64(40))
	require.False(t, l.Trigger(key("b", 6), s(11), nil), "larger than the tenant's byte cap alone")
	// No tenant: the global caps only.
	for i := range 6 {
		l.Trigger(key("", i), s(1), nil)
	}
	require.Equal(t, 8, l.Stats().Conversations)
	n, _ = l.TenantUse("")
	require.GreaterOrEqual(t, n, 3)
	l.Drop(key("a", 1))
	total := 0
	for _, tn := range []string{"a", "b", ""} {
		n, _ := l.TenantUse(tn)
		total += n
	}
	require.Equal(t, l.Stats().Conversations, total, "per-tenant counts add up to the total")
}
