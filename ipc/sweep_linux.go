package ipc

import "time"

// sweepEvery is how often the owner looks for reader slots of processes that ended without
// detaching. A client's disconnect triggers a sweep at once; this catches the rest (readers
// that opened the region without a connection, or a disconnect seen before the lease was
// dropped), so a killed worker's slots are freed within a second.
const sweepEvery = 250 * time.Millisecond

func (o *Owner) sweepLoop() {
	defer o.wg.Done()
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-o.done:
			return
		case <-t.C:
		}
		n, err := o.region.SweepReaders()
		if err != nil {
			return
		}
		if n > 0 {
			o.log.Debug("shmsteer: freed reader slots of ended processes", "slots", n)
			o.region.Reclaim() // return what they held back, even if nothing is written
		}
	}
}

// RevokedWithoutSentinel counts revocations that deleted a key but found no room for a revoked
// sentinel, neither in the mark table nor in the arena, so readers saw ErrKeyNotFound for it
// instead of ErrKeyRevoked. Non-zero means shm.Config.MarkSlots (and ArenaBytes) are too small
// for the revocation rate and grace. RevokedInArena counts those whose sentinel went in the
// arena because the mark table was full.
func (o *Owner) RevokedWithoutSentinel() uint64 { return o.revokeUnmarked.Load() }

// RevokedInArena counts revocations whose sentinel went in the arena because the mark table
// was full (readers still see ErrKeyRevoked).
func (o *Owner) RevokedInArena() uint64 { return o.revokeInArena.Load() }
