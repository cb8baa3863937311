package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// ErrNoRedis reports that redis-server is not on PATH.
var ErrNoRedis = errors.New("shmsteer: bench: redis-server not on PATH")

// ErrRedisStart reports a redis-server that did not answer PING in time.
var ErrRedisStart = errors.New("shmsteer: bench: redis-server did not start")

// redisServer is a private redis-server on a loopback port, with persistence
// off so the figures measure the round trip and the lookup, not the disk.
type redisServer struct {
	cmd    *exec.Cmd
	client *redis.Client
	stderr *tail
	waited chan struct{}
}

func startRedis() (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoRedis, err)
	}
	// A port picked by the kernel and released can be taken before
	// redis-server binds it; a retry with a new port covers that race.
	var errs []error
	for range 3 {
		s, err := startRedisOnce(bin)
		if err == nil {
			return s, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func startRedisOnce(bin string) (*redisServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRedisStart, err)
	}
	dir, err := os.MkdirTemp("", "shmsteer-bench-redis-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir) // nothing is written with persistence off
	s := &redisServer{stderr: &tail{max: 4096}, waited: make(chan struct{})}
	s.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--loglevel", "warning")
	s.cmd.Stdout, s.cmd.Stderr = s.stderr, s.stderr
	setProcAttr(s.cmd)
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRedisStart, err)
	}
	go func() { _ = s.cmd.Wait(); close(s.waited) }()
	s.client = redis.NewClient(&redis.Options{
		Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		// One connection: each op is one request/response, as a worker
		// reading one key per step would do it.
		PoolSize:        1,
		DisableIdentity: true,
		// The handshake for this feature is noise against a local server.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := s.client.Ping(ctx).Err()
		cancel()
		if err == nil {
			break
		}
		exited := false
		select {
		case <-s.waited:
			exited = true
		default:
		}
		if exited || time.Now().After(deadline) {
			_ = s.stop()
			return nil, fmt.Errorf("%w: %w: %s", ErrRedisStart, err, s.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	keys := benchKeys()
	ctx := context.Background()
	for i, k := range keys {
		if err := s.client.Set(ctx, k, keyValue(i), 0).Err(); err != nil {
			_ = s.stop()
			return nil, fmt.Errorf("%w: load: %w", ErrRedisStart, err)
		}
	}
	return s, nil
}

// stop closes the client, kills the server and waits for it to exit.
func (s *redisServer) stop() error {
	cerr := s.client.Close()
	kerr := killGroup(s.cmd)
	select {
	case <-s.waited:
	case <-time.After(5 * time.Second):
		return fmt.Errorf("%w: redis-server pid %d did not exit", ErrChildTimeout, s.cmd.Process.Pid)
	}
	return errors.Join(cerr, kerr)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// redisShared lets the get and set contenders share one server.
type redisShared struct {
	mu   sync.Mutex
	refs int
	s    *redisServer
	err  error
}

func (r *redisShared) setup(op string) setupFunc {
	return func() (Op, func() error, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.s == nil && r.err == nil {
			r.s, r.err = startRedis()
		}
		if r.err != nil {
			return nil, nil, r.err
		}
		r.refs++
		c, keys := r.s.client, benchKeys()
		ctx := context.Background()
		val := keyValue(7)
		var f func(n int) error
		switch op {
		case "get":
			f = func(n int) error {
				var acc byte
				for i := range n {
					v, err := c.Get(ctx, keys[i&(numKeys-1)]).Bytes()
					if err != nil {
						return err
					}
					acc ^= v[i&(valueSize-1)]
				}
				sink.Store(uint32(acc))
				return nil
			}
		case "set":
			f = func(n int) error {
				for i := range n {
					if err := c.Set(ctx, keys[i&(numKeys-1)], val, 0).Err(); err != nil {
						return err
					}
				}
				return nil
			}
		}
		return goOp(f), r.release, nil
	}
}

func (r *redisShared) release() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refs--
	if r.refs > 0 || r.s == nil {
		return nil
	}
	s := r.s
	r.s = nil
	return s.stop()
}
