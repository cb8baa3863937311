package serve

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
)

// Auth modes of the control API (Config.Auth).
const (
	// AuthKeys (the default) is closed: every /v1/ call needs a configured key.
	AuthKeys = "keys"
	// AuthFork behaves as the vLLM fork's steering API: with no key configured the API is
	// open; with keys, the steering mutations (forkGated) need one, while GET reads and the
	// named-vector registry do not.
	AuthFork = "fork"
)

// forkGated are the routes --auth fork guards with a key when keys are configured: the fork's
// set, clear and module mutations, and serve's own admissions and conversation drops.
var forkGated = map[string]bool{
	"/v1/steering/set":                true,
	"/v1/steering/clear":              true,
	"/v1/steering/modules/register":   true,
	"/v1/steering/modules/unregister": true,
	"/v1/requests/admit":              true,
	"/v1/requests/end":                true,
	"/v1/conversations/{tenant}/{id}": true,
}

// authorize decides who a /v1/ call on route runs as. In AuthKeys every call needs a key. In
// AuthFork: with no key configured everyone is unscoped; with keys, a gated route needs one
// (ErrUnauthorized, with the fork's reason) and any other route runs as the key presented if
// it is valid, else unscoped (the fork ignores the header there).
func (s *Server) authorize(r *http.Request, route string) (principal, error) {
	if s.cfg.Auth != AuthFork {
		return s.keys.authenticate(r)
	}
	if s.keys.count() == 0 {
		return principal{}, nil
	}
	p, err := s.keys.authenticate(r)
	if err == nil || !forkGated[route] {
		return p, nil
	}
	if r.Header.Get("Authorization") == "" {
		return principal{}, fmt.Errorf("%w (Unauthorized: steering API key required)", ErrUnauthorized)
	}
	return principal{}, fmt.Errorf("%w (Unauthorized: invalid steering API key)", ErrUnauthorized)
}

// isLoopback reports whether a --http address only takes local connections: a unix socket,
// localhost or a loopback IP. An empty host (all interfaces) is not.
func isLoopback(addr string) bool {
	if strings.HasPrefix(addr, "unix:") {
		return true
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ErrForkTenants means --auth fork was given a key file with tenant keys: the fork's open
// routes run a caller without a key, or with a wrong one, unscoped, so a tenant's key would
// keep nothing apart (another tenant's named vectors overwritten, every tenant's status and
// capture results read).
var ErrForkTenants = errors.New("shmsteer: --auth fork cannot keep tenants apart: its open routes run callers without a key unscoped")

// checkForkAuth refuses --auth fork with no API key on an address others can reach (the
// control API would be open to the network) and with tenant keys (ErrForkTenants).
func checkForkAuth(cfg Config, keys, tenants int) error {
	if cfg.Auth != AuthFork {
		return nil
	}
	if keys == 0 && !isLoopback(cfg.HTTP) {
		return fmt.Errorf("%w: --auth fork with no API key would open the control API on %s to the network: give --api-key-file, or listen on a loopback address (--http 127.0.0.1:PORT) or unix:PATH", ErrConfig, cfg.HTTP)
	}
	if tenants > 0 {
		return fmt.Errorf("%w: %s holds %d tenant key(s) (tenant:key lines); use the default --auth keys to keep tenants apart, or only unscoped keys with --auth fork", ErrForkTenants, cfg.APIKeyFile, tenants)
	}
	return nil
}

// reloadKeys re-reads the API key file (SIGHUP). The old keys stay if the file is bad, or if
// it holds no key while --auth fork listens beyond loopback (that would open the API).
func (s *Server) reloadKeys() (int, error) {
	var fresh apiKeys
	n, err := fresh.load(s.cfg.APIKeyFile)
	if err != nil {
		return 0, err
	}
	if err := checkForkAuth(s.cfg, n, tenantKeys(fresh.keys)); err != nil {
		return 0, err
	}
	s.keys.mu.Lock()
	s.keys.keys = fresh.keys
	s.keys.mu.Unlock()
	return n, nil
}
