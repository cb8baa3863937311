package ipc

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSecretNeverPrints(t *testing.T) {
	env := newTestEnv()
	s := env.secret
	oo := env.ownerOpts()
	co := env.clientOpts()
	values := []any{s, &s, oo, &oo, co, &co, []Secret{s}, map[string]Secret{"k": s}}
	var outs []string
	for _, v := range values {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%T"} {
			outs = append(outs, fmt.Sprintf(verb, v))
		}
		js, _ := json.Marshal(v)
		outs = append(outs, string(js))
	}
	outs = append(outs, s.String(), s.GoString(), fmt.Sprint(s), fmt.Sprintln(s))
	var logBuf bytes.Buffer
	for _, h := range []slog.Handler{slog.NewTextHandler(&logBuf, nil), slog.NewJSONHandler(&logBuf, nil)} {
		slog.New(h).Info("opts", "secret", s, "ptr", &s, "owner", oo, "client", co)
	}
	outs = append(outs, logBuf.String())
	requireNoSecret(t, env, outs...)
	require.Equal(t, redacted, fmt.Sprintf("%v", s))
}

// requireNoSecret checks that no string contains the secret, raw or hex-encoded.
func requireNoSecret(t *testing.T, env testEnv, outs ...string) {
	t.Helper()
	hexed := hex.EncodeToString([]byte(env.secretStr))
	for _, o := range outs {
		require.NotContains(t, o, env.secretStr)
		require.NotContains(t, strings.ToLower(o), hexed)
	}
}

func TestSecretNotInErrorsOrLogs(t *testing.T) {
	env := newTestEnv()
	var logBuf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts := env.ownerOpts()
	opts.Logger = log
	opts.Grace = 10 * time.Millisecond
	o := newTestOwner(t, opts)

	var errs []error
	collect := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	_, err := NewOwner(opts)
	collect(err)
	wrong := NewSecret([]byte(env.secretStr + "x"))
	_, err = Attach(ClientOptions{Secret: &wrong, Namespace: env.ns, handle: o.handle})
	collect(err)
	_, err = Attach(ClientOptions{Secret: &wrong, Namespace: env.ns})
	collect(err)
	bad := opts
	bad.MaxFrameBytes = 1
	_, err = NewOwner(bad)
	collect(err)
	c := attach(t, env.clientOpts())
	collect(c.Keys().Set("", nil))
	collect(c.Keys().Set("id", make([]byte, 1<<20)))
	collect(c.Keys().Remove("nope"))
	_, err = c.Call(999, []byte(env.secretStr[:4]))
	collect(err)
	require.NoError(t, c.Close())
	require.NoError(t, o.Close())
	require.GreaterOrEqual(t, len(errs), 7)

	var outs []string
	for _, e := range errs {
		outs = append(outs, e.Error(), fmt.Sprintf("%+v", e), fmt.Sprintf("%#v", e))
		for u := errors.Unwrap(e); u != nil; u = errors.Unwrap(u) {
			outs = append(outs, fmt.Sprintf("%#v", u))
		}
	}
	outs = append(outs, logBuf.String())
	require.Contains(t, logBuf.String(), "attach refused", "the auth failure was logged")
	requireNoSecret(t, env, outs...)
}

func TestDeriveKey(t *testing.T) {
	a, b := NewSecret([]byte("secret-a")), NewSecret([]byte("secret-b"))
	ka1, err := a.DeriveKey("p1", 32)
	require.NoError(t, err)
	require.Len(t, ka1, 32)
	again, err := NewSecret([]byte("secret-a")).DeriveKey("p1", 32)
	require.NoError(t, err)
	require.Equal(t, ka1, again, "deterministic")
	ka2, err := a.DeriveKey("p2", 32)
	require.NoError(t, err)
	require.NotEqual(t, ka1, ka2, "purposes are independent")
	kb1, err := b.DeriveKey("p1", 32)
	require.NoError(t, err)
	require.NotEqual(t, ka1, kb1, "secrets are independent")
	require.NotContains(t, string(ka1), "secret-a")
	_, err = Secret{}.DeriveKey("p1", 32)
	require.ErrorIs(t, err, ErrAuthSecretNotDefined)
}
