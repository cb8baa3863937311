package ipc

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

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

// requireNoSecret checks that no string contains the secret: raw, hex-encoded, or as the
// decimal byte list fmt prints for a []byte with %v.
func requireNoSecret(t *testing.T, env testEnv, outs ...string) {
	t.Helper()
	hexed := hex.EncodeToString([]byte(env.secretStr))
	decimal := strings.Trim(fmt.Sprint([]byte(env.secretStr)), "[]")
	for _, o := range outs {
		require.NotContains(t, o, env.secretStr)
		require.NotContains(t, strings.ToLower(o), hexed)
		require.NotContains(t, o, decimal)
	}
}

func TestSecretNotInErrorsOrLogs(t *testing.T) {
	env := newTestEnv()
	var logBuf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts := env.ownerOpts()
	opts.Logger = log
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
	collect(clientStore(c).Set("", nil))
	collect(clientStore(c).Set("id", make([]byte, 1<<20)))
	collect(clientStore(c).Remove("nope"))
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

// TestNothingPrintsTheSecret prints every exported type that can hold the secret, directly
// and nested in unexported fields (which fmt reaches by reflection without calling methods).
func TestNothingPrintsTheSecret(t *testing.T) {
	env := newTestEnv()
	oo := env.ownerOpts()
	co := env.clientOpts()
	o := newTestOwner(t, oo)
	c := attach(t, co)
	_, ownerErr := NewOwner(oo)
	require.Error(t, ownerErr)
	wrong := NewSecret([]byte(env.secretStr + "x"))
	_, attachErr := Attach(ClientOptions{Secret: &wrong, Namespace: env.ns})
	require.Error(t, attachErr)
	type nested struct {
		o  *Owner
		c  *Client
		s  Secret
		oo OwnerOptions
	}
	values := []any{o, c, oo, &oo, co, &co, env.secret, &env.secret,
		ownerErr, attachErr, struct{ O *Owner }{o}, []any{o, c}}
	var outs []string
	print := func(values []any) {
		for _, v := range values {
			for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d"} {
				outs = append(outs, fmt.Sprintf(verb, v))
			}
			js, _ := json.Marshal(v)
			outs = append(outs, string(js))
		}
		var logBuf bytes.Buffer
		for _, h := range []slog.Handler{slog.NewTextHandler(&logBuf, nil), slog.NewJSONHandler(&logBuf, nil)} {
			l := slog.New(h)
			for i, v := range values {
				l.Info("value", "i", i, "v", v)
			}
			l.Info("all", "owner", o, "client", c, "opts", oo, "copts", co, "err", attachErr)
		}
		outs = append(outs, logBuf.String())
	}
	print(values)
	live := nested{o, c, env.secret, oo}
	outs = append(outs, fmt.Sprintf("%v %+v %#v", live, live, live))
	require.Contains(t, fmt.Sprintf("%+v", o), env.ns, "the owner prints its namespace")
	require.Contains(t, fmt.Sprintf("%v", c), "attached")
	// Nested in unexported fields, fmt reaches the values by reflection (and with a verb
	// that does not fit a pointer, such as %s, it prints what the pointer points to): only
	// once closed, so that reflection does not race with the owner's goroutines.
	require.NoError(t, c.Close())
	require.NoError(t, o.Close())
	// Keep a live copy of the secret in the owner to find: Close wiped the owner's own.
	o.secret = env.secret.clone()
	print([]any{nested{o, c, env.secret, oo}, &nested{o, c, env.secret, oo},
		reflect.ValueOf(env.secret)})
	// The Owner and Client structs themselves, as reflection sees them (say, through a copy):
	// with %s fmt would also follow their *shm.Region to the (now unmapped) mapping, so only
	// the verbs that print nested pointers as addresses.
	for _, v := range []any{reflect.ValueOf(o).Elem(), reflect.ValueOf(c).Elem()} {
		outs = append(outs, fmt.Sprintf("%v %+v %#v", v, v, v))
	}
	requireNoSecret(t, env, outs...)
}

func TestSecretFromFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, b, 0o600))
		return p
	}
	big := bytes.Repeat([]byte("s"), MaxSecretFileBytes)
	tests := []struct {
		name    string
		path    string
		want    string // the secret read, if no error
		wantErr error
	}{
		{"plain", write("plain", []byte("abc")), "abc", nil},
		{"one newline stripped", write("nl", []byte("abc\n")), "abc", nil},
		{"crlf stripped", write("crlf", []byte("abc\r\n")), "abc", nil},
		{"only one newline stripped", write("nl2", []byte("abc\n\n")), "abc\n", nil},
		{"at the cap", write("cap", append(append([]byte{}, big...), '\n')), string(big), nil},
		{"over the cap", write("over", append(append([]byte{}, big...), 's')), "", ErrSecretFile},
		{"empty", write("empty", nil), "", ErrAuthSecretNotDefined},
		{"only a newline", write("newline", []byte("\n")), "", ErrAuthSecretNotDefined},
		{"missing", filepath.Join(dir, "missing"), "", ErrSecretFile},
		{"directory", dir, "", ErrSecretFile},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := SecretFromFile(tt.path, SecretFileOptions{})
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				require.Contains(t, err.Error(), tt.path, "the error names the path")
				require.NotContains(t, err.Error(), "sss", "never the content")
				return
			}
			require.NoError(t, err)
			require.Equal(t, NewSecret([]byte(tt.want)).mac(), s.mac())
		})
	}
	// Private refuses a file open to group or others, and takes a private one.
	for _, mode := range []os.FileMode{0o640, 0o604, 0o620} {
		p := write(fmt.Sprintf("mode-%o", mode), []byte("abc\n"))
		require.NoError(t, os.Chmod(p, mode))
		_, err := SecretFromFile(p, SecretFileOptions{Private: true})
		require.ErrorIs(t, err, ErrSecretFile, "mode %o", mode)
		require.Contains(t, err.Error(), "chmod 600")
		_, err = SecretFromFile(p, SecretFileOptions{})
		require.NoError(t, err, "without Private the mode is not checked")
	}
	s, err := SecretFromFile(write("private", []byte("abc\n")), SecretFileOptions{Private: true})
	require.NoError(t, err)
	require.Equal(t, NewSecret([]byte("abc")).mac(), s.mac())
	if os.Getuid() != 0 { // root reads any file
		p := write("unreadable", []byte("abc"))
		require.NoError(t, os.Chmod(p, 0))
		_, err := SecretFromFile(p, SecretFileOptions{})
		require.ErrorIs(t, err, ErrSecretFile)
		require.Contains(t, err.Error(), p)
	}
}

// TestSecretPrecedence: an explicit option wins over the environment; the same source given
// twice is ErrSecretConflict.
func TestSecretPrecedence(t *testing.T) {
	dir := t.TempDir()
	fromFile := filepath.Join(dir, "secret")
	require.NoError(t, os.WriteFile(fromFile, []byte("file-secret\n"), 0o600))
	explicit := NewSecret([]byte("explicit-secret"))
	tests := []struct {
		name           string
		envVal, envFil string
		opt            *Secret
		optFile        string
		want           string
		wantErr        error
	}{
		{"env value", "env-secret", "", nil, "", "env-secret", nil},
		{"env file", "", fromFile, nil, "", "file-secret", nil},
		{"env both", "env-secret", fromFile, nil, "", "", ErrSecretConflict},
		{"option file over env", "env-secret", fromFile, nil, fromFile, "file-secret", nil},
		{"option secret over env", "env-secret", "", &explicit, "", "explicit-secret", nil},
		{"options both", "", "", &explicit, fromFile, "", ErrSecretConflict},
		{"nothing", "", "", nil, "", "", ErrAuthSecretNotDefined},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(SecretEnv, tt.envVal)
			t.Setenv(SecretFileEnv, tt.envFil)
			s, err := resolveSecret(tt.opt, tt.optFile, false)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, NewSecret([]byte(tt.want)).mac(), s.mac())
		})
	}
	t.Run("DropEnv drops both", func(t *testing.T) {
		t.Setenv(SecretEnv, "")
		t.Setenv(SecretFileEnv, fromFile)
		_, err := resolveSecret(nil, "", true)
		require.NoError(t, err)
		_, set := lookupEnv(SecretFileEnv)
		require.False(t, set)
	})
}

// TestAttachWithSecretFile runs an owner from a SecretFile option and a client process from
// SHMSTEER_SECRET_FILE: the secret never enters the child's environment.
func TestAttachWithSecretFile(t *testing.T) {
	env := newTestEnv()
	p := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(p, []byte(env.secretStr+"\n"), 0o600))
	opts := env.ownerOpts()
	opts.Secret, opts.SecretFile = nil, p
	o := newTestOwner(t, opts)
	require.NoError(t, ownerStore(o).Set("req", []byte("k")))
	kid := startProc(t, "client", SecretFileEnv+"="+p, nsEnv+"="+env.ns)
	require.Equal(t, "ok ready", kid.Line())
	require.Equal(t, "ok "+hexOf("k"), kid.Do("get req"))
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", kid.Cmd.Process.Pid))
	require.NoError(t, err)
	require.NotContains(t, string(environ), env.secretStr)
	kid.Exit()
}

// TestNonDumpable: a second process of the same uid (65534) can open /proc/PID/mem and list
// /proc/PID/fd of an owner or client, unless it runs with NonDumpable.
func TestNonDumpable(t *testing.T) {
	exe := nobodyExe(t)
	for _, tt := range []struct {
		name, role, nondump, want string
	}{
		{"owner dumpable", "owner", "0", "mem ok fd ok"},
		{"owner non-dumpable", "owner", "1", "mem denied fd denied"},
		{"client non-dumpable", "client", "1", "mem denied fd denied"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if scope, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil && strings.TrimSpace(string(scope)) != "0" && tt.nondump == "0" {
				t.Skip("Yama ptrace_scope > 0 keeps a non-parent from /proc/PID/mem even of a dumpable process")
			}
			env := newTestEnv()
			if tt.role == "client" {
				opts := env.ownerOpts()
				opts.AllowUIDs = []int{nobody}
				newTestOwner(t, opts)
			}
			target := startProcAs(t, exe, nobodyCred, tt.role,
				append(env.childEnv(), nondumpEnv+"="+tt.nondump, ownerUIDsEnv+"=0")...)
			require.Equal(t, "ok ready", target.Line())
			prober := startProcAs(t, exe, nobodyCred, "probe")
			require.Equal(t, "ok ready", prober.Line())
			require.Equal(t, tt.want, prober.Do(fmt.Sprint("probe ", target.Cmd.Process.Pid)))
			prober.Exit()
			target.Exit()
		})
	}
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

func TestResolveSecret(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "s")
	require.NoError(t, os.WriteFile(file, []byte("from-file\n"), 0o600))
	for _, tc := range []struct {
		name  string
		value []byte
		path  string
		want  string
		err   error
	}{
		{"bytes", []byte("b"), "", "b", nil},
		{"file", nil, file, "from-file", nil},
		{"both", []byte("b"), file, "", ErrSecretConflict},
		{"both, empty bytes", []byte{}, file, "", ErrSecretConflict},
		{"neither", nil, "", "", ErrAuthSecretNotDefined},
		{"empty bytes", []byte{}, "", "", ErrAuthSecretNotDefined},
		{"missing file", nil, filepath.Join(dir, "none"), "", ErrSecretFile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ResolveSecret(tc.value, tc.path)
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
				require.NotContains(t, err.Error(), "from-file")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, string(s.bytes()))
		})
	}
}
