package main

import (
	"os"
	"strconv"
	"strings"
)

// cpuSample is the machine's CPU time so far, from /proc/stat (Linux): the
// server runs on the same machine, so busy time between two samples is what
// a run cost client and server together. ok is false where /proc/stat is
// not readable; figures from it are then left out.
type cpuSample struct {
	busy, total uint64 // clock ticks (USER_HZ, 100 per second on Linux)
	ok          bool
}

const ticksPerSecond = 100

func readCPU() cpuSample {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuSample{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return cpuSample{}
	}
	var s cpuSample
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return cpuSample{}
		}
		s.total += n
		if i != 3 && i != 4 { // idle and iowait
			s.busy += n
		}
	}
	s.ok = true
	return s
}

// perOp is the machine CPU time, in microseconds, per operation between a
// and b; NaN-free: 0 with ok false when it cannot tell.
func perOp(a, b cpuSample, ops int64) (float64, bool) {
	if !a.ok || !b.ok || ops <= 0 || b.busy < a.busy {
		return 0, false
	}
	return float64(b.busy-a.busy) * 1e6 / ticksPerSecond / float64(ops), true
}
