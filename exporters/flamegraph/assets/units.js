// What the values of a sample type mean: how the page names each type and shows its values in the
// type's unit, so off-CPU time reads as ms and s rather than as a count of nanoseconds. Its own
// file so that node can check it without a browser (tests/test_flamegraph.py).
var FlameUnits = (function () {
  "use strict";

  // The types the profiling receiver sends; any other is named by its own type and unit. `more`
  // and `less` head the comparison's lists of functions whose share grew and shrank.
  const COSTS = { more: "Costs more", less: "Costs less" };
  const ALLOCATES = { more: "Allocates more", less: "Allocates less" };
  const HOLDS = { more: "Holds more", less: "Holds less" };
  const KNOWN = {
    "samples/count": { label: "CPU", noun: "samples", empty: "No CPU samples in this window yet.", ...COSTS },
    "off_cpu/nanoseconds": { label: "Off-CPU", noun: "off-CPU time", empty: "No off-CPU time in this window yet.", ...COSTS },
    // Waits told apart; lock_wake is lock_wait's time again, each wait's stack topped by its waker's
    // (upside down, above a "[woken by]" frame: who held the lock).
    "lock_wait/nanoseconds": { label: "Lock waits", noun: "waiting for locks", empty: "No lock waits in this window yet.", ...COSTS },
    "lock_wake/nanoseconds": { label: "Lock waits by waker", noun: "waiting for locks", empty: "No lock waits in this window yet.", ...COSTS },
    "io_wait/nanoseconds": { label: "I/O waits", noun: "waiting for I/O", empty: "No I/O waits in this window yet.", ...COSTS },
    // Memory, as Go's heap profiles name the types; in use: the live heap at each process's report.
    "inuse_space/bytes": { label: "In-use memory", noun: "in use", empty: "No in-use memory in this window yet.", ...HOLDS },
    "alloc_space/bytes": { label: "Allocated memory", noun: "allocated", empty: "No allocations in this window yet.", ...ALLOCATES },
    "inuse_objects/count": { label: "In-use objects", noun: "objects in use", empty: "No in-use memory in this window yet.", ...HOLDS },
    "alloc_objects/count": { label: "Allocations", noun: "allocations", empty: "No allocations in this window yet.", ...ALLOCATES },
    // Where threads and goroutines sit at each process's report (a reading, as the live heap's).
    "threads/count": { label: "Threads", noun: "threads", empty: "No thread counts in this window yet.", more: "More threads", less: "Fewer threads" },
    "goroutines/count": { label: "Goroutines", noun: "goroutines", empty: "No goroutine counts in this window yet.", more: "More goroutines",
                          less: "Fewer goroutines" },
  };
  // Each scale's factor from its unit's base and its symbol, largest first.
  const DURATIONS = [[3600e9, "h"], [60e9, "min"], [1e9, "s"], [1e6, "ms"], [1e3, "µs"], [1, "ns"]];
  const TO_NANOSECONDS = { nanoseconds: 1, microseconds: 1e3, milliseconds: 1e6, seconds: 1e9 };
  const BYTES = [[2 ** 40, "TiB"], [2 ** 30, "GiB"], [2 ** 20, "MiB"], [2 ** 10, "KiB"], [1, "B"]];

  function describe(type) {
    const known = KNOWN[type.type + "/" + type.unit];
    if (known) return known;
    const name = type.type || "untyped";
    const label = type.unit ? name + " (" + type.unit + ")" : name;
    return { label: label, noun: name, empty: "No " + name + " samples in this window yet.", ...COSTS };
  }

  // Three significant digits are plenty to compare frames; more would only be noise.
  function scaled(value, scales) {
    const [factor, symbol] = scales.find(([size]) => Math.abs(value) >= size) || scales[scales.length - 1];
    const number = value / factor;
    const digits = factor === 1 ? 0 : Math.abs(number) < 10 ? 2 : Math.abs(number) < 100 ? 1 : 0;
    return number.toFixed(digits) + " " + symbol;
  }

  // A value in its type's unit: "1234" (a count), "12.3 ms", "1.50 MiB".
  function format(value, type) {
    if (type.unit in TO_NANOSECONDS) return scaled(value * TO_NANOSECONDS[type.unit], DURATIONS);
    if (type.unit === "bytes") return scaled(value, BYTES);
    if (type.unit === "count" || !type.unit) return String(Math.round(value));
    return value + " " + type.unit;
  }

  // A value with what it counts: "1234 samples", "12.3 ms off-CPU time", "9.00 MiB in use".
  function phrase(value, type) {
    return format(value, type) + " " + describe(type).noun;
  }

  return { describe: describe, format: format, phrase: phrase };
})();

if (typeof module !== "undefined") module.exports = FlameUnits;
