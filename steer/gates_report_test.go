package steer

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// A gate report round-trips; DecodeGateReport refuses every other length.
func TestGateReportRoundTrip(t *testing.T) {
	r := GateReport{ReportsMissed: 9}
	for s := range r.Scopes {
		r.Scopes[s] = GateStats{Evaluations: uint64(10 * s), Fires: uint64(s), Engaged: uint64(s * s)}
	}
	w, got, err := DecodeGateReport(append(r.encode(), "rank7"...))
	require.NoError(t, err)
	require.Equal(t, "rank7", w)
	require.Equal(t, r, got)
	for _, n := range []int{0, gateReportLen, gateReportLen + MaxWorkerName + 1} {
		_, _, err := DecodeGateReport(make([]byte, n))
		require.ErrorIs(t, err, ErrBadEncoding, "%d bytes", n)
	}
}

// FuzzDecodeGateReport: any payload is refused or read back to the same bytes.
func FuzzDecodeGateReport(f *testing.F) {
	f.Add(append(GateReport{}.encode(), 'w'))
	f.Add([]byte("short"))
	f.Fuzz(func(t *testing.T, b []byte) {
		w, r, err := DecodeGateReport(b)
		if err != nil {
			return
		}
		if !bytes.Equal(append(r.encode(), w...), b) {
			t.Fatalf("%x read back as %q %+v", b, w, r)
		}
	})
}
