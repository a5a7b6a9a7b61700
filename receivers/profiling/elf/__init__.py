"""Reading ELF files: segments, build ids, notes, where a separate debug file may be, USDT probes
(stapsdt.py), each within the bounds bounded.py sets (the files are the sampled processes').

Shared by symbols/, unwind/, python/, v8/, hotspot/ and otel_context/; imports nothing else of the
receiver."""
