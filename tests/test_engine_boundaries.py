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
