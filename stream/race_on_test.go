//go:build race

package stream

// raceEnabled is true under the race detector, whose sync.Pool drops items
// at random: allocation counts do not hold then.
const raceEnabled = true
