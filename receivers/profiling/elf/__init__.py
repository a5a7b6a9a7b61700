"""Reading ELF files: segments, build ids, notes, where a separate debug file may be.

Shared by symbols/, unwind/ and python/; imports nothing else of the receiver."""
