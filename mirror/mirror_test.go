package mirror

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// TestMirrorPropagates: three hosts; a change on one is readable by every other host's worker
// (vectors, a set larger than NATS's max payload through the object store, global tiers, keys,
// their deletion); each host publishes exactly its own changes, never one it applied.
func TestMirrorPropagates(t *testing.T) {
	n := startNATS(t)
	secret := newSecret()
	hs := startHosts(t, n, secret, []string{"a", "b", "c"}, hostOpts{keys: true})
	a, b, c := hs[0], hs[1], hs[2]
	all := func(cmd, want, what string) {
		t.Helper()
		for _, h := range hs {
			eventually(t, h.worker, cmd, want, 20*time.Second, what+" on "+h.id)
		}
	}
	local := map[*host]uint64{}
	write := func(h *host, cmd string) {
		t.Helper()
		h.owner.OK(cmd)
		local[h]++
		require.Equal(t, "ok true", h.owner.Do("drain"))
	}

	write(a, "reg alpha 11 3")
	all("vec alpha", "11/3", "a's vector")
	write(b, "reg alpha 12 2")
	all("vec alpha", "12/2", "b's replacement")
	write(c, "reg big 13 80") // 80 × 16 KiB: 1.3 MB, above the 1 MB max payload
	all("vec big", "13/80", "a set through the object store")
	write(c, "reg big 14 80") // replaces it (and deletes the superseded object)
	all("vec big", "14/80", "a replaced large set")
	requireObjects(t, n, vectorEntry("big")+"/")
	write(a, "global alpha 2")
	all("global", "ok alpha*2", "global tiers")
	write(b, "reg beta 15 1")
	all("vec beta", "15/1", "beta")
	write(c, "unreg beta")
	all("vec beta", "none", "an unregistered vector")
	write(a, "global - 0")
	all("global", "ok none", "cleared global tiers")
	write(c, "regprobe alpha 17") // a probe named like a steering vector is another entry
	all("probe alpha", "17/1", "a probe vector")
	all("vec alpha", "12/2", "the steering vector of the probe's name")
	write(a, "unregprobe alpha")
	all("probe alpha", "none", "an unregistered probe")
	all("vec alpha", "12/2", "the steering vector, after its namesake probe went")
	b.worker.OK("reg fromworker 16 2") // a worker's write reaches the owner over RPC, then the mirror
	local[b]++
	require.Equal(t, "ok true", b.owner.Do("drain"))
	all("vec fromworker", "16/2", "a worker's write")

	write(b, "setkey req-1 "+fmt.Sprintf("%x", "key-one"))
	all("key req-1", "ok "+fmt.Sprintf("%x", "key-one"), "a key")
	write(c, "rmkey req-1")
	all("key req-1", "err revoked", "a revoked key")
	write(a, "setkey req-1 "+fmt.Sprintf("%x", "key-two"))
	all("key req-1", "ok "+fmt.Sprintf("%x", "key-two"), "a key set again")

	var applied uint64
	for _, h := range hs {
		st := h.owner.status()
		require.True(t, st.Connected && st.Ready && st.InitialSync, "%+v", st)
		require.Equal(t, local[h], st.Published, "host %s publishes its own changes only", h.id)
		require.Zero(t, st.Rejected+st.Tampered+st.QueueFull, "%+v", st)
		applied += st.Applied
	}
	var total uint64
	for _, v := range local {
		total += v
	}
	require.Equal(t, 2*total, applied, "every change applied once on each other host")
}

// TestMirrorConcurrentConverge: three hosts write one name at once, round after round; every
// host's worker ends with the same value, one of the three written.
func TestMirrorConcurrentConverge(t *testing.T) {
	rounds := 200
	if testing.Short() {
		rounds = 5
	}
	n := startNATS(t)
	hs := startHosts(t, n, newSecret(), []string{"a", "b", "c"}, hostOpts{keys: true})
	winners := map[string]int{}
	for r := range rounds {
		var wg sync.WaitGroup
		for i, h := range hs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h.owner.Send(fmt.Sprintf("reg x %d 1", 1000*r+i+1))
				h.owner.Send(fmt.Sprintf("setkey kx %x", fmt.Sprint(1000*r+i+1)))
			}()
		}
		wg.Wait()
		for _, h := range hs {
			require.True(t, strings.HasPrefix(h.owner.Line(), "ok"))
			require.True(t, strings.HasPrefix(h.owner.Line(), "ok"))
		}
		for _, h := range hs {
			require.Equal(t, "ok true", h.owner.Do("drain"))
		}
		// All acknowledged: the bucket's last revision decides; wait until every worker agrees.
		var final string
		deadline := time.Now().Add(20 * time.Second)
		for {
			vals := map[string]bool{}
			for _, h := range hs {
				vals[h.worker.Do("vec x")] = true
			}
			if len(vals) == 1 {
				for v := range vals {
					final = v
				}
				break
			}
			require.True(t, time.Now().Before(deadline), "round %d: no convergence: %v", r, vals)
			time.Sleep(time.Millisecond)
		}
		ok := false
		for i := range hs {
			ok = ok || final == fmt.Sprintf("%d/1", 1000*r+i+1)
		}
		require.True(t, ok, "round %d converged to %s, not a written value", r, final)
		var finalKey string
		for {
			vals := map[string]bool{}
			for _, h := range hs {
				vals[h.worker.Do("key kx")] = true
			}
			if len(vals) == 1 {
				for v := range vals {
					finalKey = v
				}
				break
			}
			require.True(t, time.Now().Before(deadline), "round %d: keys do not converge: %v", r, vals)
			time.Sleep(time.Millisecond)
		}
		ok = false
		for i := range hs {
			ok = ok || finalKey == fmt.Sprintf("ok %x", fmt.Sprint(1000*r+i+1))
		}
		require.True(t, ok, "round %d: key converged to %s, not a written value", r, finalKey)
		winners[final[len(final)-3:len(final)-2]]++
	}
	t.Logf("%d rounds of 3 concurrent writers (a vector and a key each) converged on all hosts; vector winner host index counts %v", rounds, winners)
}

// TestMirrorFaults: host b is partitioned from NATS while host a writes and the server
// acknowledges; the server is SIGKILLed; a goes on writing locally (its changes queue); the
// server restarts on the same store, b's partition heals: b's worker reads every change, the
// acknowledged ones and the queued ones.
func TestMirrorFaults(t *testing.T) {
	n := startNATS(t)
	hs := startHosts(t, n, newSecret(), []string{"a", "b"}, hostOpts{keys: true, proxy: true})
	a, b := hs[0], hs[1]
	a.owner.OK("reg warm 1 1")
	eventually(t, b.worker, "vec warm", "1/1", 20*time.Second, "before the faults")

	b.proxy.setCut(true) // partition b
	const acked, queued = 20, 5
	for i := range acked {
		a.owner.OK(fmt.Sprintf("reg p%d %d 1", i, 100+i))
		a.owner.OK(fmt.Sprintf("setkey k%d %x", i, fmt.Sprint("key-", i)))
	}
	require.Equal(t, "ok true", a.owner.Do("drain"), "the server acknowledged every change")
	require.Equal(t, "none", b.worker.Do("vec p0"), "b is partitioned")
	b.owner.OK("reg fromb 77 1") // b writes while partitioned: it queues
	require.Equal(t, "77/1", b.worker.Do("vec fromb"), "local reads and writes go on in a partition")

	n.p.Kill() // SIGKILL the server
	for i := acked; i < acked+queued; i++ {
		a.owner.OK(fmt.Sprintf("reg p%d %d 1", i, 100+i)) // local writes go on
	}
	eventually(t, a.worker, fmt.Sprintf("vec p%d", acked+queued-1), fmt.Sprintf("%d/1", 100+acked+queued-1), 5*time.Second, "local reads while NATS is down")
	// The client notices the lost connection asynchronously: poll until its status says so.
	st := a.owner.status()
	for deadline := time.Now().Add(10 * time.Second); st.Connected && time.Now().Before(deadline); st = a.owner.status() {
		time.Sleep(2 * time.Millisecond)
	}
	require.False(t, st.Connected, "a's mirror still reports a connection 10 s after the server's SIGKILL: %+v", st)
	require.Positive(t, st.QueueDepth, "changes queue while NATS is down: %+v", st)

	n.start() // same store, same port
	b.proxy.setCut(false)
	for i := range acked + queued {
		eventually(t, b.worker, fmt.Sprintf("vec p%d", i), fmt.Sprintf("%d/1", 100+i), 30*time.Second, "after restart and partition")
	}
	for i := range acked {
		eventually(t, b.worker, fmt.Sprintf("key k%d", i), fmt.Sprintf("ok %x", fmt.Sprint("key-", i)), 10*time.Second, "keys after restart")
	}
	eventually(t, a.worker, "vec fromb", "77/1", 20*time.Second, "b's change made in the partition")
	require.Equal(t, "ok true", a.owner.Do("drain"))
	require.Equal(t, "ok true", b.owner.Do("drain"))
	sa, sb := a.owner.status(), b.owner.status()
	require.Zero(t, sa.QueueDepth)
	require.Positive(t, sa.Reconnects)
	require.Positive(t, sb.Reconnects)
	t.Logf("a: %+v", sa)
	t.Logf("b: %+v", sb)

	// b's owner is SIGKILLed and comes back with the same host id (a new region: it catches up
	// from the bucket, its own earlier changes included); host c joins late.
	b.worker.Kill()
	b.owner.Kill()
	late := startHosts(t, n, b.secret, []string{"b", "c"}, hostOpts{keys: true})
	for _, h := range late {
		for i := range acked + queued {
			eventually(t, h.worker, fmt.Sprintf("vec p%d", i), fmt.Sprintf("%d/1", 100+i), 20*time.Second, "catch-up of "+h.id)
		}
		eventually(t, h.worker, "vec fromb", "77/1", 20*time.Second, "catch-up of "+h.id)
		eventually(t, h.worker, fmt.Sprintf("key k%d", acked-1), fmt.Sprintf("ok %x", fmt.Sprint("key-", acked-1)), 20*time.Second, "keys on "+h.id)
		require.Zero(t, h.owner.status().Published, "catching up publishes nothing")
	}
}

// requireObjects checks that the object store holds exactly one object, named with prefix:
// the set went through it, and the superseded one was deleted.
func requireObjects(t *testing.T, n *natsServer, prefix string) {
	t.Helper()
	nc, err := nats.Connect(n.url())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	os, err := js.ObjectStore(ctx, DefaultBucket+"-blobs")
	require.NoError(t, err)
	deadline := time.Now().Add(20 * time.Second)
	for {
		infos, err := os.List(ctx)
		require.NoError(t, err)
		if len(infos) == 1 {
			require.True(t, strings.HasPrefix(infos[0].Name, prefix), infos[0].Name)
			require.Greater(t, infos[0].Size, uint64(1<<20), "larger than the max payload")
			return
		}
		require.True(t, time.Now().Before(deadline), "%d objects", len(infos))
		time.Sleep(20 * time.Millisecond)
	}
}
