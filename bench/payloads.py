"""Realistic OTLP profiles payloads, shaped like a host report of the profiling receiver: many
processes of a few kinds, deep stacks through shared libraries and the kernel, threads, and one
dictionary shared by the whole message. Each process maps its binaries at its own (ASLR) base,
so mappings and locations are per process while strings and functions are shared."""

from __future__ import annotations

import dataclasses
import random

from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata import ProfilesBuilder

PERIOD_NS = 1_000_000_000 // 97
PAGE = 4096


@dataclasses.dataclass(frozen=True)
class Binary:
    path: str
    build_id: str
    functions: tuple[str, ...]
    kind: str = "native"


@dataclasses.dataclass(frozen=True)
class PayloadShape:
    processes: int = 60
    stacks_per_process: tuple[int, int] = (20, 60)
    user_depth: tuple[int, int] = (8, 48)
    kernel_depth: tuple[int, int] = (4, 16)
    kernel_share: float = 0.3  # of stacks sampled while in the kernel
    threads_per_process: tuple[int, int] = (1, 8)


def _binary(rng: random.Random, path: str, prefix: str, functions: int, kind: str = "native") -> Binary:
    names = tuple(f"{prefix}_{rng.choice(('read', 'write', 'parse', 'hash', 'lookup', 'alloc', 'free', 'send', 'poll', 'eval'))}_{index}" for index in range(functions))
    return Binary(path, "%032x" % rng.getrandbits(128), names, kind)


def _binaries(rng: random.Random) -> tuple[Binary, list[Binary], list[Binary]]:
    kernel = _binary(rng, "[kernel.kallsyms]", "kernel", 1500, "kernel")
    libraries = [
        _binary(rng, "/usr/lib/x86_64-linux-gnu/libc.so.6", "libc", 400),
        _binary(rng, "/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "_ZNSt", 600),
        _binary(rng, "/usr/lib/x86_64-linux-gnu/libssl.so.3", "ssl", 300),
        _binary(rng, "/usr/lib/x86_64-linux-gnu/libz.so.1", "zlib", 80),
    ]
    programs = [_binary(rng, f"/usr/bin/{name}", name, 800) for name in ("postgres", "nginx", "python3.11", "node", "envoy", "redis-server", "containerd", "kubelet")]
    return kernel, libraries, programs


class _Process:
    """One process: its program, libraries at their own base addresses, threads and stacks."""

    def __init__(self, rng: random.Random, pid: int, program: Binary, libraries: list[Binary], threads: int) -> None:
        self.pid = pid
        self.program = program
        self.bases = {binary.path: rng.randrange(0x5500_0000_0000, 0x7F00_0000_0000, 1 << 21) for binary in (program, *libraries)}
        self.threads = {pid + offset: f"{program.path.rsplit('/', 1)[-1][:12]}-{offset}" for offset in range(threads)}


def build(seed: int, shape: PayloadShape = PayloadShape()) -> profiles_pb2.ProfilesData:
    """One host report; the same seed builds the same payload."""
    rng = random.Random(seed)
    kernel, libraries, programs = _binaries(random.Random(0))  # the same binaries on every host
    builder = ProfilesBuilder()
    for _ in range(shape.processes):
        process = _Process(rng, rng.randrange(1000, 4_000_000), rng.choice(programs), libraries, rng.randint(*shape.threads_per_process))
        resource = builder.resource_profiles({
            "host.name": "bench-host",
            "process.pid": process.pid,
            "process.executable.name": process.program.path.rsplit("/", 1)[-1],
            "process.executable.path": process.program.path,
            "container.id": "%064x" % rng.getrandbits(256),
        })
        profile = builder.profile(
            builder.scope_profiles(resource, name="pycollector/receivers/profiling", version="0.1.0"),
            period=PERIOD_NS, time_unix_nano=1_700_000_000_000_000_000, duration_nano=5_000_000_000,
        )
        for _ in range(rng.randint(*shape.stacks_per_process)):
            frames = _user_frames(rng, builder, process, libraries, shape)
            if rng.random() < shape.kernel_share:
                frames = _kernel_frames(rng, builder, kernel, shape) + frames
            tid = rng.choice(list(process.threads))
            builder.sample(profile, builder.stack(frames), [rng.randint(1, 30)], attributes={"thread.id": tid, "thread.name": process.threads[tid]})
    return builder.data


def _location(builder: ProfilesBuilder, binary: Binary, base: int, function_index: int) -> int:
    mapping = builder.mapping(memory_start=base, memory_limit=base + (64 << 20), filename=binary.path, attributes={"process.executable.build_id.gnu": binary.build_id})
    name = binary.functions[function_index]
    function = builder.function(name, system_name=name)
    return builder.location(mapping, base + PAGE + 64 * function_index, [(function, 0, 0)], attributes={"profile.frame.type": binary.kind})


def _user_frames(rng: random.Random, builder: ProfilesBuilder, process: _Process, libraries: list[Binary], shape: PayloadShape) -> list[int]:
    """Leaf first: a few library frames over the program's own call chain."""
    depth = rng.randint(*shape.user_depth)
    # Hot paths are shared: draw the program's frames from a small range so stacks overlap.
    program_frames = [_location(builder, process.program, process.bases[process.program.path], rng.randrange(0, 120)) for _ in range(depth)]
    library = rng.choice(libraries)
    library_frames = [_location(builder, library, process.bases[library.path], rng.randrange(len(library.functions))) for _ in range(rng.randint(0, 4))]
    return library_frames + program_frames


def _kernel_frames(rng: random.Random, builder: ProfilesBuilder, kernel: Binary, shape: PayloadShape) -> list[int]:
    return [_location(builder, kernel, 0xFFFF_FFFF_8100_0000, rng.randrange(len(kernel.functions))) for _ in range(rng.randint(*shape.kernel_depth))]
