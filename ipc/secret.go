package ipc

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
)

// SecretEnv is the environment variable SecretFromEnv reads.
const SecretEnv = "SHMSTEER_SECRET"

const redacted = "[redacted]"

// Secret is the shared secret every process of one deployment knows. It derives the attach
// handle and authenticates both sides of every attach. It never prints: String, GoString,
// Format (every verb), MarshalText and LogValue all give "[redacted]".
type Secret struct {
	b []byte
}

// NewSecret copies b into a Secret. An empty secret is refused later with
// ErrAuthSecretNotDefined.
func NewSecret(b []byte) Secret { return Secret{b: append([]byte(nil), b...)} }

// SecretFromEnv reads SHMSTEER_SECRET; ErrAuthSecretNotDefined if it is unset or empty.
func SecretFromEnv() (Secret, error) {
	v := os.Getenv(SecretEnv)
	if v == "" {
		return Secret{}, ErrAuthSecretNotDefined
	}
	return Secret{b: []byte(v)}, nil
}

func (Secret) String() string                 { return redacted }
func (Secret) GoString() string               { return redacted }
func (Secret) Format(f fmt.State, _ rune)     { io.WriteString(f, redacted) }
func (Secret) MarshalText() ([]byte, error)   { return []byte(redacted), nil }
func (Secret) LogValue() slog.Value           { return slog.StringValue(redacted) }
func (s Secret) empty() bool                  { return len(s.b) == 0 }
func (s Secret) clone() Secret                { return NewSecret(s.b) }
func (s *Secret) wipe()                       { clear(s.b); s.b = nil }
func (s Secret) mac(parts ...[]byte) [32]byte { return macOf(s.b, parts...) }

func macOf(key []byte, parts ...[]byte) [32]byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	var out [32]byte
	m.Sum(out[:0])
	return out
}

// resolveSecret picks the explicit secret or the environment's, copies it (so the Owner or
// Client can wipe its copy on Close) and drops the variable if asked.
func resolveSecret(explicit *Secret, dropEnv bool) (Secret, error) {
	var s Secret
	if explicit != nil {
		s = explicit.clone()
	} else {
		env, err := SecretFromEnv()
		if err != nil {
			return Secret{}, err
		}
		s = env
	}
	if dropEnv {
		os.Unsetenv(SecretEnv)
	}
	if s.empty() {
		return Secret{}, ErrAuthSecretNotDefined
	}
	return s, nil
}

// handleName is the abstract unix socket name (without the leading NUL) for a secret and
// namespace: "shmsteer-" and the hex of HMAC-SHA256(secret, "shmsteer/handle/v1" ||
// namespace). Finding it needs the secret; being able to connect to it proves nothing (abstract
// names are listed in /proc/net/unix), which is why the handshake follows.
// lobbyName is the owner's second abstract socket, named from the namespace alone. A client
// whose secret derives no live handle knocks there before it gives up, so a wrong secret is
// reported as ErrAuthFailed (the handshake, the same as on the handle, fails) rather than as
// "no owner". It reveals only that an owner serves the namespace, which /proc/net/unix shows
// anyway.
func lobbyName(namespace string) string {
	h := sha256.Sum256(append([]byte("shmsteer/lobby/v1\x00"), namespace...))
	return "shmsteer-lobby-" + hex.EncodeToString(h[:16])
}

func handleName(s Secret, namespace string) string {
	m := s.mac([]byte("shmsteer/handle/v1"), []byte(namespace))
	return "shmsteer-" + hex.EncodeToString(m[:])
}
