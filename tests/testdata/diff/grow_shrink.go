// Two versions of one program for `pycollector diff` (tests/test_flamegraph_compare.py): growMe
// and shrinkMe call the same hot helper, spin, which holds all the self time; growMe's share of
// the calls is argv[1] percent. Its own CPU profile (runtime/pprof) for argv[2] seconds goes to
// argv[3].
package main

import (
	"os"
	"runtime/pprof"
	"strconv"
	"time"
)

var sink uint64

//go:noinline
func spin(rounds int) {
	for i := 0; i < rounds; i++ {
		sink = sink*6364136223846793005 + 1442695040888963407
	}
}

//go:noinline
func growMe() { spin(20000) }

//go:noinline
func shrinkMe() { spin(20000) }

func main() {
	share, _ := strconv.Atoi(os.Args[1])
	seconds, _ := strconv.ParseFloat(os.Args[2], 64)
	out, err := os.Create(os.Args[3])
	if err != nil {
		panic(err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		panic(err)
	}
	end := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	for time.Now().Before(end) {
		for k := 0; k < 100; k++ {
			if k < share {
				growMe()
			} else {
				shrinkMe()
			}
		}
	}
	pprof.StopCPUProfile()
	out.Close()
}
