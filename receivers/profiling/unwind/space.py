"""Where files' rows go in the unwind_rows array: ranges handed out first-fit and given back."""

from __future__ import annotations

import bisect


class RowSpace:
    def __init__(self, size: int):
        self.size = size
        self._free: list[tuple[int, int]] = [(0, size)] if size else []  # (start, length), sorted

    def allocate(self, count: int) -> int | None:
        """The first index of ``count`` free rows, or None when no free range is that long."""
        for position, (start, length) in enumerate(self._free):
            if length >= count:
                if length == count:
                    del self._free[position]
                else:
                    self._free[position] = (start + count, length - count)
                return start
        return None

    def release(self, start: int, count: int) -> None:
        """Give rows back, joining them to free neighbours."""
        position = bisect.bisect(self._free, (start, count))
        if position < len(self._free) and start + count == self._free[position][0]:
            count += self._free.pop(position)[1]
        if position and sum(self._free[position - 1]) == start:
            previous_start, previous_length = self._free[position - 1]
            self._free[position - 1] = (previous_start, previous_length + count)
        else:
            self._free.insert(position, (start, count))

    def copy(self) -> RowSpace:
        """Another space with the same free ranges (to try releases on)."""
        other = RowSpace(0)
        other.size, other._free = self.size, list(self._free)
        return other

    @property
    def free(self) -> int:
        return sum(length for _, length in self._free)

    @property
    def largest(self) -> int:
        """The longest free range: the most rows one file can be given now."""
        return max((length for _, length in self._free), default=0)
