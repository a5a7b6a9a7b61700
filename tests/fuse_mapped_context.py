"""A process that points the agent at memory a FUSE daemon of its own serves, then stops serving.

Run by tests/test_hostile_host.py as an ordinary user, with the standard library only:

    python3 fuse_mapped_context.py MOUNTPOINT [FD]

With FD, the file system is already mounted at MOUNTPOINT and FD is its /dev/fuse descriptor, as
fusermount hands them to a user (the test mounts it as root, in the host's namespaces, as the
setuid fusermount does); without, it mounts it itself (inside ``unshare -Urm``: a user namespace
may mount FUSE).

It mounts a FUSE file system at MOUNTPOINT whose one file, ``data``, this process serves from a
thread; maps that file without touching it; tells its daemon to answer no read any more (it still
answers the rest: its own exit closes the file); publishes an
OpenTelemetry process context whose payload pointer is in that mapping; and spins. A reader of its
memory there faults the page in, and the fault waits for the daemon: for ever, unless the reader
looks before it reads.
"""

import mmap
import os
import struct
import sys
import threading
import time

from otel_context_publisher import spin  # (this script's directory is on its path)

IN_HEADER = struct.Struct("=IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
OUT_HEADER = struct.Struct("=IiQ")  # len, error, unique
ATTR = struct.Struct("=QQQQQQIIIIIIIIII")  # ino, size, blocks, atime, mtime, ctime, 3 nsec, mode, nlink, uid, gid, rdev, blksize, flags
LOOKUP, FORGET, GETATTR, OPEN, READ, RELEASE, FLUSH, INIT, BATCH_FORGET = 1, 2, 3, 14, 15, 18, 25, 26, 42
SIZE = 1 << 16
silent = threading.Event()


def attributes(node: int) -> bytes:
    mode, size = (0o40755, 0) if node == 1 else (0o100644, SIZE)
    return ATTR.pack(node, size, size // 512, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)


def serve(device: int) -> None:
    while True:
        try:
            request = os.read(device, 1 << 20 | 4096)
        except OSError:
            return
        length, opcode, unique, node = IN_HEADER.unpack_from(request)[:4]
        body = request[IN_HEADER.size:length]
        if opcode in (FORGET, BATCH_FORGET):
            continue
        if opcode == READ and silent.is_set():
            continue  # a page of data from now on waits for an answer that never comes
        error, out = 0, b""
        if opcode == INIT:
            out = struct.pack("=IIIIHHIIHHI7I", 7, 31, SIZE, 0, 16, 12, SIZE, 1, 16, 0, 0, *[0] * 7)
        elif opcode == LOOKUP:
            if body.rstrip(b"\0") == b"data":
                out = struct.pack("=QQQQII", 2, 1, 3600, 3600, 0, 0) + attributes(2)
            else:
                error = -2
        elif opcode == GETATTR:
            out = struct.pack("=QII", 3600, 0, 0) + attributes(node)
        elif opcode == OPEN:
            out = struct.pack("=QII", 1, 0, 0)
        elif opcode == READ:
            out = b"\0" * struct.unpack_from("=QQI", body)[2]
        elif opcode not in (RELEASE, FLUSH):
            error = -38  # ENOSYS
        os.write(device, OUT_HEADER.pack(OUT_HEADER.size + len(out), error, unique) + out)


def main() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    mountpoint = sys.argv[1]
    if len(sys.argv) > 2:
        device = int(sys.argv[2])
    else:
        device = os.open("/dev/fuse", os.O_RDWR)
        options = f"fd={device},rootmode=40000,user_id=0,group_id=0".encode()
        if libc.mount(b"hostile", mountpoint.encode(), b"fuse", 0, options) != 0:
            sys.exit("mount: " + os.strerror(ctypes.get_errno()))
    threading.Thread(target=serve, args=(device,), daemon=True).start()
    # Mapped by libc, not by the mmap module, which keeps a descriptor of the file: closing that
    # at exit would wait on the daemon, gone by then. (Not touched: no page of it is read.)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    data = os.open(os.path.join(mountpoint, "data"), os.O_RDONLY)
    payload_at = libc.mmap(None, SIZE, mmap.PROT_READ, mmap.MAP_SHARED, data, 0)
    os.close(data)
    silent.set()
    fd = os.memfd_create("OTEL_CTX", 0)
    os.ftruncate(fd, 4096)
    context = mmap.mmap(fd, 4096)
    os.close(fd)
    struct.pack_into("=8sIIQQ", context, 0, b"\0" * 8, 2, 64, time.time_ns(), payload_at + 4096)
    context[0:8] = b"OTEL_CTX"
    print("published", flush=True)
    spin()


if __name__ == "__main__":
    main()
