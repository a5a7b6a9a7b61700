"""A process that publishes an OpenTelemetry process context (OTEP 4719) as an SDK would.

Run by the tests with any Python 3 (the standard library only):

    python otel_context_publisher.py memfd|anon|none busy|idle

It publishes the first payload read from stdin (a line of hex: an encoded Resource), prints the
region's address, then publishes each further line by the update protocol (it prints "updated"
after each), and spins on the CPU (busy) or sleeps (idle) until stdin closes.

- memfd: memfd_create("OTEL_CTX"), mapped, then closed: /proc/PID/maps shows /memfd:OTEL_CTX.
- anon: a private anonymous mapping named by prctl(PR_SET_VMA_ANON_NAME): [anon:OTEL_CTX].
"""

import ctypes
import mmap
import os
import struct
import sys
import threading
import time

SIZE = 1 << 16
HEADER = struct.Struct("=8sIIQQ")  # signature, version, payload_size, published_at_ns, payload
PAYLOAD_AT = (64, 64 + (SIZE - 64) // 2)  # two areas: an update writes the one not in use
PR_SET_VMA, PR_SET_VMA_ANON_NAME = 0x53564D41, 0
libc = ctypes.CDLL(None, use_errno=True)


def main() -> None:
    kind, activity = sys.argv[1], sys.argv[2]
    if kind == "none":  # a process like it that publishes nothing
        spin() if activity == "busy" else threading.Event().wait()
    if kind == "memfd":
        fd = os.memfd_create("OTEL_CTX", 0)
        os.ftruncate(fd, SIZE)
        region = mmap.mmap(fd, SIZE)
        os.close(fd)
    else:
        region = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(SIZE), 10)  # MADV_DONTFORK
    first = bytes.fromhex(sys.stdin.readline().strip())
    region[PAYLOAD_AT[0]:PAYLOAD_AT[0] + len(first)] = first
    HEADER.pack_into(region, 0, b"\0" * 8, 2, len(first), time.time_ns(), address + PAYLOAD_AT[0])
    region[0:8] = b"OTEL_CTX"  # the signature last
    name(address, kind)
    print(f"{address:x}", flush=True)
    threading.Thread(target=update_from_stdin, args=(region, address, kind), daemon=True).start()
    spin() if activity == "busy" else threading.Event().wait()


def update_from_stdin(region: mmap.mmap, address: int, kind: str) -> None:
    area = 0
    for line in sys.stdin:
        payload = bytes.fromhex(line.strip())
        area = 1 - area
        struct.pack_into("=Q", region, 16, 0)  # an update is under way
        region[PAYLOAD_AT[area]:PAYLOAD_AT[area] + len(payload)] = payload
        struct.pack_into("=IQ", region, 12, len(payload), 0)  # size (published_at stays 0)
        struct.pack_into("=Q", region, 24, address + PAYLOAD_AT[area])
        struct.pack_into("=Q", region, 16, time.time_ns())
        name(address, kind)
        print("updated", flush=True)
    os._exit(0)  # stdin closed: the test is done with us


def name(address: int, kind: str) -> None:
    if kind == "anon":
        libc.prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, ctypes.c_ulong(address), ctypes.c_ulong(SIZE), b"OTEL_CTX")


def spin() -> None:
    x = 0
    while True:
        for i in range(100000):
            x = (x * 31 + i) & 0xFFFFFFFF


if __name__ == "__main__":
    main()
