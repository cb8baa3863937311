package ipc

import (
	"crypto/hkdf"
	"crypto/sha256"
	"fmt"
)

// DeriveKey derives an n-byte key for one purpose from the secret with HKDF-SHA256 (RFC 5869;
// the secret is the input keying material, purpose the info string). Other packages get keys
// for their own uses (package mirror seals key registry values with one) without ever holding
// the secret. Different purposes give independent keys. ErrAuthSecretNotDefined for an empty
// secret.
func (s Secret) DeriveKey(purpose string, n int) ([]byte, error) {
	if s.empty() {
		return nil, ErrAuthSecretNotDefined
	}
	k, err := hkdf.Key(sha256.New, s.bytes(), nil, purpose, n)
	if err != nil {
		return nil, fmt.Errorf("shmsteer: derive key for %q: %w", purpose, err)
	}
	return k, nil
}
