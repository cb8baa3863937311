//go:build !race

package mirror

// raceEnabled: this test binary runs under the race detector.
const raceEnabled = false
