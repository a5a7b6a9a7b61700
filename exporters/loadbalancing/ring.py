"""Consistent hashing as the Go loadbalancing exporter hashes (contrib, before its 2026 rework):
each endpoint takes 100 places on a ring of 36,000, at CRC-32 of the endpoint and the place's
number (4 bytes, little-endian) (a taken place: the next free one within 10, else none); a key
goes to the first place at or after CRC-32 of the key, round the ring. An endpoint that comes or
goes moves only the keys of the places it takes or gave up, about 1/N of them, and a key's
backend is the one a Go collector in the same tier would pick."""

from __future__ import annotations

import bisect
import zlib

POSITIONS = 36_000
PLACES_PER_ENDPOINT = 100
MAX_PROBES = 10


class Ring:
    def __init__(self, endpoints: list[str]) -> None:
        taken: dict[int, str] = {}
        for endpoint in sorted(endpoints):
            for place in range(PLACES_PER_ENDPOINT):
                position = zlib.crc32(endpoint.encode() + place.to_bytes(4, "little")) % POSITIONS
                for _ in range(MAX_PROBES):
                    if position not in taken:
                        taken[position] = endpoint
                        break
                    position = (position + 1) % POSITIONS
        self._positions = sorted(taken)
        self._endpoints = [taken[position] for position in self._positions]
        self.endpoints = frozenset(endpoints)

    def endpoint_for(self, key: str) -> str | None:
        """The endpoint that key goes to; None on an empty ring."""
        if not self._positions:
            return None
        index = bisect.bisect_left(self._positions, zlib.crc32(key.encode()) % POSITIONS)
        return self._endpoints[index % len(self._endpoints)]
