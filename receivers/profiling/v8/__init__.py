"""V8's JavaScript frames in Node.js processes, without perf maps: where V8 keeps a frame's
function (layout.py, from the binary's v8dbg_* symbols: detect.py), the kernel's part
(bpf/v8.bpf.c), and naming the functions it recorded from the process's heap (heap.py,
runtimes.py)."""
