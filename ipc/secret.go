package ipc

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
)

// SecretEnv is the environment variable SecretFromEnv reads.
const SecretEnv = "SHMSTEER_SECRET"

// SecretFileEnv names a file holding the secret (a mounted secret, a systemd credential in
// $CREDENTIALS_DIRECTORY): the secret then never sits in /proc/PID/environ.
const SecretFileEnv = "SHMSTEER_SECRET_FILE"

// MaxSecretFileBytes bounds a secret file (after one trailing newline is stripped).
const MaxSecretFileBytes = 64 << 10

const redacted = "[redacted]"

// Secret is the shared secret every process of one deployment knows. It derives the attach
// handle and authenticates both sides of every attach. It never prints: String, GoString,
// Format (every verb), MarshalText and LogValue all give "[redacted]". A Secret nested in an
// unexported field is printed by fmt through reflection, without its methods, and with a verb
// that does not fit a pointer (%s, %d, %x) fmt even prints what a pointer points to; so the
// bytes are not in any field at all but captured by closures, which reflection shows only as
// addresses.
type Secret struct {
	k *secretKey
}

// secretKey reaches the bytes only through closures over them.
type secretKey struct {
	get  func() []byte
	wipe func()
}

// NewSecret copies b into a Secret. An empty secret is refused later with
// ErrAuthSecretNotDefined.
func NewSecret(b []byte) Secret {
	buf := append([]byte(nil), b...)
	return Secret{k: &secretKey{
		get:  func() []byte { return buf },
		wipe: func() { clear(buf); buf = nil },
	}}
}

// SecretFromEnv reads SHMSTEER_SECRET, or the file SHMSTEER_SECRET_FILE names
// (SecretFromFile); ErrSecretConflict if both are set, ErrAuthSecretNotDefined if neither is
// (or the value is empty).
func SecretFromEnv() (Secret, error) {
	var value []byte
	if v := os.Getenv(SecretEnv); v != "" {
		value = []byte(v)
	}
	s, err := ResolveSecret(value, os.Getenv(SecretFileEnv))
	clear(value)
	return s, err
}

// ResolveSecret is the one rule for a secret given as bytes or as a file: value (nil: not
// given) or the file at path ("": not given, read by SecretFromFile), never both
// (ErrSecretConflict), and one of them (ErrAuthSecretNotDefined). SecretFromEnv applies it to
// the environment, the C ABI to its arguments. value is copied.
func ResolveSecret(value []byte, path string) (Secret, error) {
	switch {
	case value != nil && path != "":
		return Secret{}, fmt.Errorf("%w: both a secret and a secret file (as arguments, or %s and %s)", ErrSecretConflict, SecretEnv, SecretFileEnv)
	case path != "":
		return SecretFromFile(path, SecretFileOptions{})
	case len(value) == 0:
		return Secret{}, ErrAuthSecretNotDefined
	}
	return NewSecret(value), nil
}

// SecretFileOptions are the checks SecretFromFile makes beyond its one rule for the content.
type SecretFileOptions struct {
	// Private refuses (ErrSecretFile) a file whose mode lets group or others read or write it
	// (mode & 077): whoever reads the secret can attach. serve's --secret-file sets it.
	Private bool
}

// SecretFromFile reads the secret from a file: its whole content, less one trailing newline
// ("\n" or "\r\n"). It is the one secret-file reader: SHMSTEER_SECRET_FILE, the SecretFile
// options, serve's --secret-file, the CLI and the C ABI (so Python) all read through it, so a
// file gives the same secret everywhere. An empty file gives ErrAuthSecretNotDefined; a file
// that cannot be read, is not a regular file (or a pipe), holds more than MaxSecretFileBytes,
// or, with opt.Private, is open to group or others gives ErrSecretFile naming the path (never
// the content).
func SecretFromFile(path string, opt SecretFileOptions) (Secret, error) {
	f, err := os.Open(path)
	if err != nil {
		return Secret{}, fmt.Errorf("%w: %w", ErrSecretFile, err) // *PathError: op, path, errno
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return Secret{}, fmt.Errorf("%w: %s: %w", ErrSecretFile, path, err)
	} else if !st.Mode().IsRegular() && st.Mode()&os.ModeNamedPipe == 0 {
		// Pipes are allowed (process substitution); directories and devices are not.
		return Secret{}, fmt.Errorf("%w: %s is a %v, not a regular file", ErrSecretFile, path, st.Mode().Type())
	} else if opt.Private && st.Mode().Perm()&0o077 != 0 {
		return Secret{}, fmt.Errorf("%w: %s is open to group or others (mode %v): chmod 600 it", ErrSecretFile, path, st.Mode().Perm())
	}
	b := make([]byte, MaxSecretFileBytes+3) // room for a trailing "\r\n" and one byte more
	n, err := io.ReadFull(f, b)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		clear(b)
		return Secret{}, fmt.Errorf("%w: reading %s: %w", ErrSecretFile, path, err)
	}
	v := b[:n]
	switch {
	case len(v) >= 2 && v[len(v)-2] == '\r' && v[len(v)-1] == '\n':
		v = v[:len(v)-2]
	case len(v) >= 1 && v[len(v)-1] == '\n':
		v = v[:len(v)-1]
	}
	defer clear(b)
	if len(v) > MaxSecretFileBytes {
		return Secret{}, fmt.Errorf("%w: %s holds more than %d bytes", ErrSecretFile, path, MaxSecretFileBytes)
	}
	if len(v) == 0 {
		return Secret{}, fmt.Errorf("%w: %s is empty", ErrAuthSecretNotDefined, path)
	}
	return NewSecret(v), nil
}

func (Secret) String() string               { return redacted }
func (Secret) GoString() string             { return redacted }
func (Secret) Format(f fmt.State, _ rune)   { io.WriteString(f, redacted) }
func (Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }
func (Secret) LogValue() slog.Value         { return slog.StringValue(redacted) }

func (s Secret) bytes() []byte {
	if s.k == nil {
		return nil
	}
	return s.k.get()
}
func (s Secret) empty() bool   { return len(s.bytes()) == 0 }
func (s Secret) clone() Secret { return NewSecret(s.bytes()) }
func (s *Secret) wipe() {
	if s.k != nil {
		s.k.wipe()
	}
}
func (s Secret) mac(parts ...[]byte) [32]byte { return macOf(s.bytes(), parts...) }

func macOf(key []byte, parts ...[]byte) [32]byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	var out [32]byte
	m.Sum(out[:0])
	return out
}

// resolveSecret picks the secret, copies it (so the Owner or Client can wipe its copy on
// Close) and drops the variables if asked. Precedence: an explicit option (Secret or
// SecretFile; both set is ErrSecretConflict) wins over the environment; in the environment,
// SHMSTEER_SECRET and SHMSTEER_SECRET_FILE both set is ErrSecretConflict.
func resolveSecret(explicit *Secret, file string, dropEnv bool) (Secret, error) {
	var s Secret
	var err error
	switch {
	case explicit != nil && file != "":
		err = fmt.Errorf("%w: both the Secret and the SecretFile option are set", ErrSecretConflict)
	case explicit != nil:
		s = explicit.clone()
	case file != "":
		s, err = SecretFromFile(file, SecretFileOptions{})
	default:
		s, err = SecretFromEnv()
	}
	if dropEnv {
		os.Unsetenv(SecretEnv)
		os.Unsetenv(SecretFileEnv)
	}
	if err != nil {
		return Secret{}, err
	}
	if s.empty() {
		return Secret{}, ErrAuthSecretNotDefined
	}
	return s, nil
}
