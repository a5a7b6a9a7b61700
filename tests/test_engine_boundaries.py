"""The engine stays independent of the components: it never imports a component folder."""

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parent.parent / "pycollector"
COMPONENT_PACKAGES = {"receivers", "processors", "exporters"}


def test_engine_never_imports_component_packages():
    offenders = []
    for path in ENGINE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.relative_to(ENGINE.parent)}:{node.lineno} imports {name}" for name in names if name.split(".")[0] in COMPONENT_PACKAGES]
    assert offenders == []


# The profiling receiver's rooms (receivers/profiling/README.md) and the rooms each may import.
# The receiver's own top (receiver, report, config, factory) may import every room.
PROFILING = ENGINE.parent / "receivers" / "profiling"
PROFILING_ROOMS = {
    "elf": set(),
    "kernel": set(),
    "processes": set(),
    "jit": {"processes"},
    "symbols": {"elf", "jit", "processes"},
    "unwind": {"elf", "processes"},
    "python": {"elf", "processes", "symbols"},
    "v8": {"elf", "processes", "symbols"},
    "hotspot": {"elf", "processes", "symbols"},
    "otel_context": {"elf", "processes", "symbols"},  # (symbols/loads.py: files parsed off the calling thread)
    "memory": {"elf", "kernel", "processes"},  # (kernel: the uprobes it attaches, the samples it reads)
    "waits": {"symbols"},  # (frame names in, a lock's kind out; a waker's frames and the marker joining them to the waiter's)
    "threads": {"elf", "kernel", "processes", "symbols"},  # (kernel: the samples it makes; symbols: Go's function table, the file detector)
}


def _profiling_imports(path: Path) -> list[tuple[int, str]]:
    """(line, room) of each import of another part of the profiling receiver."""
    package = path.relative_to(PROFILING).parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            parts = [*base, *(node.module or "").split(".")] if node.module else [*base, *(alias.name for alias in node.names[:1])]
        elif isinstance(node, ast.ImportFrom | ast.Import):
            modules = [node.module] if isinstance(node, ast.ImportFrom) else [alias.name for alias in node.names]
            parts = next((m.split(".")[2:] for m in modules if m and m.startswith("receivers.profiling.")), None)
            if parts is None:
                continue
        else:
            continue
        if parts and parts[0]:
            found.append((node.lineno, parts[0]))
    return found


def test_profiling_rooms_import_only_the_rooms_below_them():
    offenders = []
    for room, allowed in PROFILING_ROOMS.items():
        for path in (PROFILING / room).rglob("*.py"):
            for line, imported in _profiling_imports(path):
                if imported != room and imported not in allowed:
                    offenders.append(f"{path.relative_to(PROFILING)}:{line} imports {imported}")
    assert offenders == []
    rooms = {path.name for path in PROFILING.iterdir() if (path / "__init__.py").exists()}
    assert rooms == set(PROFILING_ROOMS), "a new room: say in PROFILING_ROOMS (and the README) what it may import"
