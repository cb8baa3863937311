package observe

import (
	"slices"
	"sync"
	"testing"
)

// Callbacks run in the order they were added and see every change in the order of Notify; a
// removed one is not called again (removing twice is harmless); one added or removed while a
// Notify runs takes effect from the next Notify; the same function added twice runs twice and
// each registration is removed on its own.
func TestList(t *testing.T) {
	var l List[int]
	l.Notify(0) // nothing registered
	var got []string
	rec := func(name string) func(int) {
		return func(c int) { got = append(got, name+string(rune('0'+c))) }
	}
	removeA := l.Add(rec("a"))
	removeB := l.Add(rec("b"))
	l.Notify(1)
	removeA()
	removeA()
	l.Notify(2)
	var removeLate func()
	removeSelf := func() {}
	removeSelf = l.Add(func(c int) {
		got = append(got, "s"+string(rune('0'+c)))
		removeSelf()
		removeLate = l.Add(rec("late"))
	})
	l.Notify(3)
	l.Notify(4)
	removeB()
	removeLate()
	f := rec("twice")
	r1 := l.Add(f)
	l.Add(f)
	r1()
	l.Notify(5)
	want := []string{"a1", "b1", "b2", "b3", "s3", "b4", "late4", "twice5"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// Concurrent Adds, removals and Notifies (run under -race in CI): every Notify reaches the
// callback that stays registered throughout.
func TestListConcurrent(t *testing.T) {
	var l List[int]
	var mu sync.Mutex
	n := 0
	l.Add(func(int) { mu.Lock(); n++; mu.Unlock() })
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range 500 {
				l.Add(func(int) {})()
			}
		}()
		go func() {
			defer wg.Done()
			for i := range 500 {
				l.Notify(i)
			}
		}()
	}
	wg.Wait()
	if n != 4*500 {
		t.Fatalf("the steady callback ran %d times, want %d", n, 4*500)
	}
}
