"""Seeds for the parser targets (parser_targets.py), from real programs built or found here."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from elftools.elf.elffile import ELFFile

from tests.fuzz.parser_targets import _FIRST_LINE

ROOT = Path(__file__).resolve().parents[2]
PYENV = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv")) / "versions"
PROGRAM = r"""
#include <stdio.h>
static int helper(int x) { return x * 3 + 1; }
int main(int argc, char **argv) { int s = 0; for (int i = 0; i < argc * 1000; i++) s += helper(i); printf("%d\n", s); return 0; }
"""
GO_PROGRAM = "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hi\") }\n"
ELF_VARIANTS = (["-O2"], ["-O0", "-fno-omit-frame-pointer"], ["-Os", "-s"], ["-O2", "-no-pie", "-fomit-frame-pointer"], ["-O1", "-g"])
LINE_TABLE_SOURCE = '''
def f(a, b):
    x = a + b
    for i in range(3):
        x += i
    return x
class C:
    def m(self): return [y for y in range(2)]
'''


def _built(work: Path, flags: list[str], index: int) -> Path:
    source = work / "program.c"
    source.write_text(PROGRAM)
    out = work / f"program-{index}"
    subprocess.run(["gcc", *flags, "-o", str(out), str(source)], check=True, capture_output=True)
    return out


def _section(path: Path, name: str) -> bytes | None:
    with open(path, "rb") as stream:
        section = ELFFile(stream).get_section_by_name(name)
        return section.data() if section is not None and section["sh_type"] != "SHT_NOBITS" else None


def _go_pclntab(work: Path) -> bytes | None:
    source = work / "main.go"
    source.write_text(GO_PROGRAM)
    env = {**os.environ, "GOCACHE": str(work / "gocache"), "GOPATH": str(work / "gopath"), "GO111MODULE": "off", "GOPROXY": "off"}
    try:
        subprocess.run(["go", "build", "-o", str(work / "go-program"), str(source)], check=True, capture_output=True, env=env, cwd=work)
    except (OSError, subprocess.CalledProcessError):
        return None
    return _section(work / "go-program", ".gopclntab")


def _line_tables() -> list[bytes]:
    """A kind byte (LineTableKind's order) and a table, of each pyenv CPython's functions."""
    from receivers.profiling.python.offsets import LineTableKind

    kinds = list(LineTableKind)
    script = ("import sys\nns = {}\nexec(compile(%r, 'seed.py', 'exec'), ns)\n"
              "code = ns['f'].__code__\n"
              "table = getattr(code, 'co_linetable', None) if sys.version_info >= (3, 10) else code.co_lnotab\n"
              "sys.stdout.write(table.hex())\n") % LINE_TABLE_SOURCE
    seeds = []
    for version in sorted(PYENV.glob("*")) if PYENV.exists() else ():
        major, minor = (int(part) for part in version.name.split(".")[:2])
        kind = (LineTableKind.LNOTAB_UNSIGNED if major == 2 else LineTableKind.LNOTAB if minor < 10
                else LineTableKind.LINETABLE_310 if minor == 10 else LineTableKind.LOCATIONS)
        try:
            table = subprocess.run([str(version / "bin" / "python"), "-c", script], capture_output=True, text=True, check=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        seeds.append(bytes([kinds.index(kind)]) + bytes.fromhex(table))
    assert _FIRST_LINE  # the targets read every table from this first line
    return seeds


def _debug_offsets() -> list[bytes]:
    from receivers.profiling.python.detect import detect_cpython

    seeds = []
    for library in sorted(PYENV.glob("3.1[3-9]*/lib/libpython3.*.so*")) + sorted(PYENV.glob("3.1[3-9]*/bin/python3.1*")):
        cpython = detect_cpython(str(library))
        if cpython is not None and cpython.debug_offsets_data:
            seeds.append(cpython.debug_offsets_data)
    if seeds:  # and the same cut short, and claiming a version whose layout is not known
        whole = seeds[0]
        seeds += [whole[:100], whole[:200], whole[:8] + (0x030F00F0).to_bytes(8, "little") + whole[16:]]
    return seeds


def parser_seeds() -> dict[str, list[bytes]]:
    with tempfile.TemporaryDirectory(prefix="fuzz-seeds-") as directory:
        work = Path(directory)
        programs = [_built(work, flags, index) for index, flags in enumerate(ELF_VARIANTS)]
        elf = [path.read_bytes() for path in programs]
        frames = [b"\0" + table for path in programs if (table := _section(path, ".eh_frame"))]
        frames += [b"\1" + table for path in programs if (table := _section(path, ".debug_frame"))]
        libc = _section(Path("/usr/lib/x86_64-linux-gnu/libc.so.6"), ".eh_frame")
        if libc:
            frames.append(b"\0" + libc[:16384])
        pclntab = _go_pclntab(work)
        go = [pclntab[:size] for size in (1024, 4096, 16384, 65536)] if pclntab else []
    perf_maps = [
        b"3c3b2a00 40 JS:*spinHeavy /w/known_split.js:3:19\n3c3b2b00 20 Builtin:ArgumentsAdaptorTrampoline\n",
        b"7f3c0c0a1000 180 long KnownSplit.spinHeavy(long)\n7f3c0c0a2000 80 Interpreter\n7f3c0c0a3000 20 StubRoutines (1)\n",
        b"0x1000 0x10 overlapping one\n0x1008 0x10 replaces it\n1000 10 again\n",
        b"401000 100 " + b"n" * 300 + b"\nbad line\n402000 zz bad size\n403000 10 tail without newline",
    ]
    return {
        "elf_file": elf,
        "eh_frame": frames,
        "gopclntab": go,
        "perf_map": perf_maps,
        "cpython_linetable": _line_tables(),
        "cpython_debug_offsets": _debug_offsets(),
    }
