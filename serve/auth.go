package serve

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
)

var (
	// ErrAPIKeyFile means the API key file cannot be read or has a malformed line; the message
	// gives the line number, never the key.
	ErrAPIKeyFile = errors.New("shmsteer: bad API key file")
	// ErrUnauthorized means a /v1/ request brought no valid "Authorization: Bearer KEY".
	ErrUnauthorized = errors.New("shmsteer: unauthorized: send Authorization: Bearer KEY with a key from the server's --api-key-file")
	// ErrForbidden means the key is valid but scoped to a tenant that may not do this.
	ErrForbidden = errors.New("shmsteer: forbidden for this key's tenant")
)

var tenantRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// apiKey is one configured key: its SHA-256 and its tenant ("" for an unscoped key).
type apiKey struct {
	hash   [32]byte
	tenant string
}

// apiKeys holds the configured keys (hashed); reloadable for rotation.
type apiKeys struct {
	mu   sync.RWMutex
	keys []apiKey
}

// parseAPIKeys reads "key" or "tenant:key" lines; blank lines and lines starting with '#' are
// skipped. A tenant is 1..64 of [A-Za-z0-9_.-].
func parseAPIKeys(b []byte) ([]apiKey, error) {
	var out []apiKey
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		tenant, key := "", line
		if i := strings.IndexByte(line, ':'); i >= 0 {
			tenant, key = line[:i], line[i+1:]
			if !tenantRE.MatchString(tenant) {
				return nil, fmt.Errorf("%w: line %d: tenant must be 1-64 of [A-Za-z0-9_.-]", ErrAPIKeyFile, n)
			}
		}
		if len(key) < 16 {
			return nil, fmt.Errorf("%w: line %d: key shorter than 16 bytes", ErrAPIKeyFile, n)
		}
		out = append(out, apiKey{hash: sha256.Sum256([]byte(key)), tenant: tenant})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrAPIKeyFile, err)
	}
	return out, nil
}

func (k *apiKeys) load(path string) (int, error) {
	if path == "" {
		k.mu.Lock()
		k.keys = nil
		k.mu.Unlock()
		return 0, nil
	}
	st, err := os.Stat(path)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrAPIKeyFile, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return 0, fmt.Errorf("%w: %s is readable by group or others (mode %v): chmod 600 it", ErrAPIKeyFile, path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrAPIKeyFile, err)
	}
	defer clear(b)
	keys, err := parseAPIKeys(b)
	if err != nil {
		return 0, err
	}
	k.mu.Lock()
	k.keys = keys
	k.mu.Unlock()
	return len(keys), nil
}

// tenants counts the configured keys scoped to a tenant.
func (k *apiKeys) tenants() int {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return tenantKeys(k.keys)
}

func tenantKeys(keys []apiKey) int {
	n := 0
	for _, key := range keys {
		if key.tenant != "" {
			n++
		}
	}
	return n
}

func (k *apiKeys) count() int {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return len(k.keys)
}

// principal is who a request authenticated as.
type principal struct{ tenant string }

func (p principal) admin() bool { return p.tenant == "" }

// owns reports whether p may touch a named vector or module called name.
func (p principal) owns(name string) bool {
	return p.admin() || strings.HasPrefix(name, p.tenant+"/")
}

// authenticate checks the bearer key against every configured key in constant time (every
// key is compared, whatever matches).
func (k *apiKeys) authenticate(r *http.Request) (principal, error) {
	h := r.Header.Get("Authorization")
	scheme, param, _ := strings.Cut(h, " ")
	if !strings.EqualFold(scheme, "bearer") || param == "" {
		return principal{}, ErrUnauthorized
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(param)))
	k.mu.RLock()
	defer k.mu.RUnlock()
	match := -1
	for i := range k.keys {
		if subtle.ConstantTimeCompare(got[:], k.keys[i].hash[:]) == 1 {
			match = i
		}
	}
	if match < 0 {
		return principal{}, ErrUnauthorized
	}
	return principal{tenant: k.keys[match].tenant}, nil
}
