package ipc

import (
	"crypto/sha256"
	"encoding/hex"
)

// lobbyName is the owner's second abstract socket, named from the namespace alone. A client
// whose secret derives no live handle knocks there before it gives up, so a wrong secret is
// reported as ErrAuthFailed (the handshake, the same as on the handle, fails) rather than as
// "no owner". It reveals only that an owner serves the namespace, which /proc/net/unix shows
// anyway.
func lobbyName(namespace string) string {
	h := sha256.Sum256(append([]byte("shmsteer/lobby/v1\x00"), namespace...))
	return "shmsteer-lobby-" + hex.EncodeToString(h[:16])
}

// handleName is the abstract unix socket name (without the leading NUL) for a secret and
// namespace.
func handleName(s Secret, namespace string) string {
	m := s.mac([]byte("shmsteer/handle/v1"), []byte(namespace))
	return "shmsteer-" + hex.EncodeToString(m[:])
}
