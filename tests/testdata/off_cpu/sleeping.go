// Computes 25% of the time and sleeps 75% in time.Sleep, for SECONDS (the first argument), then
// prints the nanoseconds it slept. A Go program's threads park in the scheduler (futex, epoll)
// while its goroutine sleeps: the off-CPU profile's stacks are those of the threads.
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

//go:noinline
func compute(d time.Duration) uint64 {
	end := time.Now().Add(d)
	x := uint64(1)
	for time.Now().Before(end) {
		for i := 0; i < 1000; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	return x
}

//go:noinline
func nap() time.Duration {
	start := time.Now()
	time.Sleep(75 * time.Millisecond)
	return time.Since(start)
}

func main() {
	seconds, _ := strconv.ParseFloat(os.Args[1], 64)
	end := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	var slept time.Duration
	var x uint64
	for time.Now().Before(end) {
		x += compute(25 * time.Millisecond)
		slept += nap()
	}
	fmt.Println(slept.Nanoseconds() + int64(x&0))
}
