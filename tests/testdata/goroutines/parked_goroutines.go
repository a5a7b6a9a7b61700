// Goroutines blocked at known places (tests/test_thread_profiles.py): once a line comes on stdin,
// POOL goroutines block in a channel receive in waitInThePool and DOOR in waitAtTheDoor. When all
// are blocked the program writes its own runtime/pprof goroutine profile (debug=1: a count per
// stack, with function names) to stdout, between the lines "profile <unix ns>" and "end", and
// again every 250 ms, until stdin's end.
package main

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"time"
)

var never = make(chan int)

//go:noinline
func waitInThePool(ready chan<- bool) {
	ready <- true
	<-never
}

//go:noinline
func waitAtTheDoor(ready chan<- bool) {
	ready <- true
	<-never
}

func main() {
	pool, door := 100, 10
	if len(os.Args) > 2 {
		pool, _ = strconv.Atoi(os.Args[1])
		door, _ = strconv.Atoi(os.Args[2])
	}
	input := bufio.NewScanner(os.Stdin)
	if !input.Scan() {
		os.Exit(1)
	}
	ready := make(chan bool)
	for i := 0; i < pool; i++ {
		go waitInThePool(ready)
	}
	for i := 0; i < door; i++ {
		go waitAtTheDoor(ready)
	}
	for i := 0; i < pool+door; i++ {
		<-ready
	}
	// Until every goroutine is parked in its receive (the last sent its ready just before).
	for runtime.NumGoroutine() > 0 {
		time.Sleep(10 * time.Millisecond)
		if blockedInReceive(pool + door) {
			break
		}
	}
	done := make(chan bool)
	go func() {
		for input.Scan() {
		}
		close(done)
	}()
	for {
		fmt.Printf("profile %d\n", time.Now().UnixNano())
		pprof.Lookup("goroutine").WriteTo(os.Stdout, 1)
		fmt.Println("end")
		select {
		case <-done:
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Whether at least n goroutines are blocked in a channel receive, as the runtime's own traceback says.
func blockedInReceive(n int) bool {
	buffer := make([]byte, 1<<20)
	all := string(buffer[:runtime.Stack(buffer, true)])
	count := 0
	for at := 0; ; {
		i := indexFrom(all, "[chan receive]", at)
		if i < 0 {
			break
		}
		count++
		at = i + 1
	}
	return count >= n
}

func indexFrom(s, sub string, from int) int {
	for i := from; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}
