package main

import "runtime"

func maxprocs() int { return runtime.GOMAXPROCS(0) }
