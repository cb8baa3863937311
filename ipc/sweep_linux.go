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
