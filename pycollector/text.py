"""Text that came from somewhere else, made safe to print on a terminal.

A process name, a path or a perf map entry is any bytes its owner chose: an escape sequence in
one can move the cursor, rewrite what a person sees, retitle the window or (on some terminals)
answer back as keystrokes; a bidirectional override reorders the rest of the line. What is
printed for people goes through `printable()`: each such character becomes a visible escape
(``\\x1b``, ``\\u202e``), and the line keeps its own newlines and tabs.
"""

from __future__ import annotations

_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]
# Characters that change the order or direction of what follows them (Unicode's bidirectional
# controls): a name could make a line read differently from what it holds.
_BIDI = [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_ESCAPES = {code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" for code in (*_CONTROLS, *_BIDI)}
_KEPT_IN_TEXT = {ord("\n"), ord("\t")}
_TEXT_TABLE = {code: escape for code, escape in _ESCAPES.items() if code not in _KEPT_IN_TEXT}


def printable(text: str, *, keep_lines: bool = True) -> str:
    """``text`` with every control and bidirectional character escaped; newlines and tabs kept
    unless ``keep_lines`` is False (a value inside one line of a log)."""
    return text.translate(_TEXT_TABLE if keep_lines else _ESCAPES)
