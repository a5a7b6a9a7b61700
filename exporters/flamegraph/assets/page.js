// The flame graph page: shows one sample type (CPU samples, off-CPU time, ...), filters its
// per-process call trees, merges what is selected and hands the result to d3-flame-graph. The same
// code runs served live (refreshing from data.json) and as a saved file (data inlined, no server).
// The type, filters and search live in the URL fragment
// (#type=off_cpu&process=1234&container=abc&attr=http.route%3D%2Fcheckout&span=5b8e&search=spin),
// so a link or a saved file opens on the same view; the type is left out for the first (CPU when
// there is CPU data). Samples linked to spans can be narrowed to one span attribute's value
// (attr), or to the spans whose trace or span id starts with what is typed (span); the spans with
// the most samples are listed above the graph, a click showing one.
//
// Compare draws a diff flame graph (compare.js computes it): the comparison's call tree, each
// frame coloured by how its share of the total changed against the baseline, and a table of the
// functions whose share grew and shrank most. The baseline and the comparison are two time ranges
// of the window (#compare=time&bfrom=&bto=&afrom=&ato=, unix seconds), two values of a resource
// attribute (#compare=resource&key=service.version&base=1.4&after=1.5), or a pinned view and what
// came after it (#compare=pin&pin=unix seconds; the view pinned lives in the tab's session storage). Time ranges come from
// the window's segments, which carry no spans: the attribute and span filters do not apply to them.
//
// The timeline above the graph draws the selected processes' values per segment (a slice of the
// window, a second or more) over the window; dragging on it selects a time range, which the graph
// and the table then show (#from=&to=, unix seconds: the range's first segment's start and last
// segment's end). "Compare with another range" makes it the baseline of a time comparison, and
// the next drag picks the comparison. The table lists each function's self and total value (self:
// its frames' own values, as the graph draws them; total: once per stack), sortable and narrowed
// by the search (#view=graph or table shows one of the two; #sort=self). A saved file opens on the
// view the link had when it was downloaded (the server puts it in the data: data.fragment).
// A type whose values are a level (type.snapshot: the live heap's in-use memory, read at each
// report) is never summed over time: a time range is each process's latest reading in it, and
// the two sides are compared by value (FlameCompare's levels), so a leak shows as growth.
(function () {
  "use strict";

  const AUTO_REFRESH_MS = 10000;
  const ALL = "";
  const NO_CONTAINER = "-";
  const live = document.body.dataset.live === "true";
  let data = JSON.parse(document.getElementById("profile-data").textContent);
  let chart = null;
  let searchText = "";  // what the search found, shown in the details line when no frame is hovered
  // Shown when the window holds no samples at all: an empty CPU graph, as before any type existed.
  const NO_TYPE = { id: "", type: "samples", unit: "count", total: 0, processes: [] };

  const typeSelect = document.getElementById("type");
  const processSelect = document.getElementById("process");
  const containerSelect = document.getElementById("container");
  const attributeSelect = document.getElementById("attribute");
  const spanInput = document.getElementById("span");
  const SPANS_LISTED = 10;
  const searchInput = document.getElementById("search");
  const details = document.getElementById("details");
  const chartElement = document.getElementById("chart");
  const autoRefresh = document.getElementById("auto-refresh");
  const compareSelect = document.getElementById("compare");
  const baseFrom = document.getElementById("base-from");
  const baseTo = document.getElementById("base-to");
  const afterFrom = document.getElementById("after-from");
  const afterTo = document.getElementById("after-to");
  const resourceKey = document.getElementById("resource-key");
  const baseValue = document.getElementById("base-value");
  const afterValue = document.getElementById("after-value");
  const DIFF_ROWS = 10;  // functions listed each way
  const TABLE_ROWS = 200;  // functions listed in the table (of those the search leaves)
  const viewSelect = document.getElementById("view");
  const timelineElement = document.getElementById("timeline");
  const compareRangeButton = document.getElementById("compare-range");
  const wholeWindowButton = document.getElementById("whole-window");
  let range = null;  // {from, to}: the time range the timeline selected, unix seconds
  let tableSort = "total";
  const PIN_STORAGE = "pycollector-flamegraph-pin";
  let pinned = readPin();  // {type, at, tree}: the baseline "pin this view" took
  let pinAt = 0;  // the pin's moment, unix seconds, as the link gives it

  function processId(process) {
    return process.pid === null ? process.name : String(process.pid);
  }

  function processLabel(process) {
    return process.pid === null ? process.name : process.name + " [" + process.pid + "]";
  }

  // The selected type's data: its processes, and its type and unit for formatting values.
  function selectedType() {
    return data.types.find((type) => type.id === typeSelect.value) || data.types[0] || NO_TYPE;
  }

  function readFragment() {
    const params = new URLSearchParams(location.hash.slice(1) || data.fragment || "");
    // A saved diff (pycollector diff -o) opens on its comparison unless the link asks otherwise.
    const preset = params.has("compare") ? {} : data.compare || {};
    const value = (name, presetName) => params.get(name) || preset[presetName || name] || "";
    return { type: params.get("type") || "", process: params.get("process") || ALL, container: params.get("container") || ALL,
             attribute: params.get("attr") || ALL, span: params.get("span") || "", search: params.get("search") || "",
             compare: value("compare", "mode"), bfrom: value("bfrom"), bto: value("bto"), afrom: value("afrom"), ato: value("ato"),
             key: value("key"), base: value("base"), after: value("after"), pin: Number(params.get("pin")) || 0,
             from: Number(params.get("from")) || 0, to: Number(params.get("to")) || 0, view: params.get("view") || "",
             sort: params.get("sort") || "total" };
  }

  function writeFragment() {
    const params = new URLSearchParams();
    if (data.types.length && selectedType() !== data.types[0]) params.set("type", selectedType().id);
    if (processSelect.value) params.set("process", processSelect.value);
    if (containerSelect.value) params.set("container", containerSelect.value);
    if (attributeSelect.value) params.set("attr", attributeSelect.value);
    if (spanInput.value) params.set("span", spanInput.value);
    if (searchInput.value) params.set("search", searchInput.value);
    if (compareSelect.value) {
      params.set("compare", compareSelect.value);
      const fields = compareSelect.value === "time" ? { bfrom: baseFrom, bto: baseTo, afrom: afterFrom, ato: afterTo }
        : compareSelect.value === "resource" ? { key: resourceKey, base: baseValue, after: afterValue } : {};
      for (const [name, element] of Object.entries(fields)) if (element.value) params.set(name, element.value);
      if (compareSelect.value === "pin" && pinAt) params.set("pin", String(pinAt));
    } else if (range) {
      params.set("from", range.from.toFixed(3));
      params.set("to", range.to.toFixed(3));
    }
    if (viewSelect.value) params.set("view", viewSelect.value);
    if (tableSort !== "total") params.set("sort", tableSort);
    history.replaceState(null, "", "#" + params.toString());
    const download = document.getElementById("download");  // (the saved file opens on this view)
    if (download) download.href = "flamegraph.html?fragment=" + encodeURIComponent(params.toString());
  }

  function option(value, text, selected) {
    const element = document.createElement("option");
    element.value = value;
    element.textContent = text;
    element.selected = value === selected;
    return element;
  }

  function percent(part, whole) {
    return whole ? (100 * part / whole).toFixed(1) + "%" : "0%";
  }

  // Rebuilds the selects from the current data, keeping what was selected when it still exists.
  // The type selector shows once there is more than one type, CPU first (the server's order).
  function fillSelects(wanted) {
    document.getElementById("type-control").hidden = data.types.length < 2;
    typeSelect.replaceChildren(...data.types.map((type) => option(type.id, FlameUnits.describe(type).label, wanted.type)));
    fillProcessSelects(wanted);
  }

  // The processes and containers of the selected type: a process may have only CPU samples or
  // only off-CPU time in the window.
  function fillProcessSelects(wanted) {
    const type = selectedType();
    processSelect.replaceChildren(option(ALL, "All processes (" + type.processes.length + ")", wanted.process));
    for (const process of type.processes) {
      processSelect.append(option(processId(process), processLabel(process) + " — " + percent(process.total, type.total), wanted.process));
    }
    const containers = [...new Set(type.processes.map((p) => p.container).filter(Boolean))].sort();
    document.getElementById("container-control").hidden = containers.length === 0;
    containerSelect.replaceChildren(option(ALL, "All", wanted.container), option(NO_CONTAINER, "Host (no container)", wanted.container));
    for (const container of containers) {
      containerSelect.append(option(container, container.slice(0, 12), wanted.container));
    }
    fillAttributeSelect(wanted);
    fillCompareControls(wanted);
  }

  // -- comparison -------------------------------------------------------------------------------

  function clock(unix) {
    return new Date(unix * 1000).toLocaleTimeString();
  }

  // A select's options from [value, text] pairs, keeping `wanted` when it is one of them, else
  // choosing `fallback`.
  function fillOptions(select, pairs, wanted, fallback) {
    const chosen = pairs.some(([value]) => value === wanted) ? wanted : fallback;
    select.replaceChildren(...pairs.map(([value, text]) => option(value, text, chosen)));
  }

  // Time ranges are picked in the window's segments; by default the older half is the baseline and
  // the newer half the comparison. Resource attributes are those with two values or more among the
  // type's processes, service.version first.
  function fillCompareControls(wanted) {
    const type = selectedType();
    compareSelect.value = wanted.compare || "";
    const segments = type.segments || [];
    const starts = segments.map((segment) => [segment.start_unix.toFixed(3), "from " + clock(segment.start_unix)]);
    const ends = segments.map((segment) => [segment.end_unix.toFixed(3), clock(segment.end_unix)]);
    const half = Math.max(1, Math.floor(segments.length / 2));
    const at = (list, index) => (list[Math.min(index, list.length - 1)] || [""])[0];
    fillOptions(baseFrom, starts, wanted.bfrom, at(starts, 0));
    fillOptions(baseTo, ends, wanted.bto, at(ends, half - 1));
    fillOptions(afterFrom, starts, wanted.afrom, at(starts, half));
    fillOptions(afterTo, ends, wanted.ato, at(ends, ends.length - 1));
    const values = resourceValues();
    const keys = [...values.keys()].filter((key) => values.get(key).size > 1)
      .sort((a, b) => (b === "service.version") - (a === "service.version") || (a < b ? -1 : 1));
    fillOptions(resourceKey, keys.map((key) => [key, key]), wanted.key, keys[0] || "");
    fillResourceValues(wanted, values);
  }

  function fillResourceValues(wanted, values) {
    const sorted = [...(values.get(resourceKey.value) || [])].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
    const pairs = sorted.map((value) => [value, value]);
    fillOptions(baseValue, pairs, wanted.base, sorted[0] || "");
    fillOptions(afterValue, pairs, wanted.after, sorted[sorted.length - 1] || "");
  }

  // Each resource attribute of the type's processes, with the values they have.
  function resourceValues() {
    const values = new Map();
    for (const process of selectedType().processes) {
      for (const [key, value] of Object.entries(process.resource || {})) {
        if (!values.has(key)) values.set(key, new Set());
        values.get(key).add(value);
      }
    }
    return values;
  }

  function wantedCompare() {
    return { compare: compareSelect.value, bfrom: baseFrom.value, bto: baseTo.value, afrom: afterFrom.value, ato: afterTo.value,
             key: resourceKey.value, base: baseValue.value, after: afterValue.value };
  }

  // Whether a segment is within [from, to] (unix seconds): its middle is, so a boundary that
  // rounding moved a little takes neither neighbour.
  function within(segment, from, to) {
    const middle = (segment.start_unix + segment.end_unix) / 2;
    return middle >= from && middle <= to;
  }

  // The selected processes' [stack index, value] pairs in the segments within [from, to], per
  // process index; for a level, each process's latest reading there (segments come oldest first).
  function segmentPairs(from, to) {
    const type = selectedType();
    const wanted = new Set(selectedProcesses().map((process) => type.processes.indexOf(process)));
    const byProcess = new Map();
    for (const segment of type.segments || []) {
      if (!within(segment, from, to)) continue;
      for (const [index, stacks] of segment.processes) {
        if (!wanted.has(index)) continue;
        if (type.snapshot || !byProcess.has(index)) byProcess.set(index, []);
        byProcess.get(index).push(...stacks);
      }
    }
    return byProcess;
  }

  // The selected processes' samples within [from, to] as one call tree.
  function segmentsTree(from, to) {
    return FlameCompare.treeOf([...segmentPairs(from, to).values()].flat(), data.frames || [], data.stacks || []);
  }

  // The selected processes' samples within [from, to], one node per process (as processNode's).
  function rangeNodes(from, to) {
    const type = selectedType();
    return [...segmentPairs(from, to)].map(([index, pairs]) => {
      const children = FlameCompare.treeOf(pairs, data.frames || [], data.stacks || []);
      return { name: processLabel(type.processes[index]), value: treeTotal(children), children: children };
    }).filter((node) => node.value > 0);
  }

  // The processes' graphs (under the span filters) as one tree with no process level: the two
  // sides are different processes when they are two versions.
  function processesTree(processes) {
    return FlameCompare.mergeTrees([[], ...processes.map((process) => processNode(process).children)]);
  }

  // [baseline, comparison], each {tree, label}; a side is null when there is nothing to compare yet.
  function compareSides() {
    const mode = compareSelect.value;
    if (mode === "time") {
      return [{ tree: segmentsTree(+baseFrom.value, +baseTo.value), label: clock(+baseFrom.value) + "–" + clock(+baseTo.value) },
              { tree: segmentsTree(+afterFrom.value, +afterTo.value), label: clock(+afterFrom.value) + "–" + clock(+afterTo.value) }];
    }
    if (mode === "resource") {
      const key = resourceKey.value;
      const side = (value) => ({ tree: processesTree(selectedProcesses().filter((process) => (process.resource || {})[key] === value)),
                                 label: key + "=" + value });
      return [side(baseValue.value), side(afterValue.value)];
    }
    // The pin's moment is in the link (pin=unix seconds): what the window still holds before it is
    // the baseline, unless this tab pinned it and kept the view as it was then.
    const at = pinAt || (pinned && pinned.type === selectedType().id ? pinned.at : 0);
    if (!at) return [null, null];
    const kept = pinned && pinned.at === at && pinned.type === selectedType().id;
    return [{ tree: kept ? pinned.tree : segmentsTree(-Infinity, at), label: "pinned at " + clock(at) },
            { tree: segmentsTree(at, Infinity), label: "since " + clock(at) }];
  }

  function treeTotal(children) {
    return children.reduce((sum, node) => sum + node.value, 0);
  }

  function readPin() {
    try {
      return JSON.parse(sessionStorage.getItem(PIN_STORAGE) || "null");
    } catch (error) {
      return null;  // (storage refused, as for a file opened with strict settings)
    }
  }

  // The selected processes over the whole window becomes the baseline; what comes later, the comparison.
  function pinView() {
    pinned = { type: selectedType().id, at: Math.floor(data.generated_unix), tree: segmentsTree(-Infinity, Infinity) };
    pinAt = pinned.at;
    try {
      sessionStorage.setItem(PIN_STORAGE, JSON.stringify(pinned));
    } catch (error) {
      // kept in memory only
    }
    compareSelect.value = "pin";
    showCompareControls();
    writeFragment();
    render();
  }

  function showCompareControls() {
    const mode = compareSelect.value;
    document.getElementById("compare-time").hidden = mode !== "time";
    document.getElementById("compare-resource").hidden = mode !== "resource";
    const spansApply = mode !== "time" && mode !== "pin" && !(range && !mode);
    attributeSelect.disabled = spansApply ? false : true;
    spanInput.disabled = spansApply ? false : true;
  }

  // A frame's tooltip and details line: its share on each side and the change (for a level,
  // its value on each side and the change in value).
  function diffLabel(type, baseTotal, afterTotal) {
    return (node) => {
      const base = node.data.base || 0;
      if (type.snapshot) {
        return node.data.name + " — comparison " + FlameUnits.phrase(node.data.value, type) + ", baseline " + FlameUnits.format(base, type) + ", " +
          signed(node.data.value - base, type);
      }
      const after = node.data.value / afterTotal;
      const change = 100 * (after - base / baseTotal);
      return node.data.name + " — comparison " + (100 * after).toFixed(1) + "% (" + FlameUnits.phrase(node.data.value, type) + "), baseline " +
        (100 * base / baseTotal).toFixed(1) + "%, " + (change >= 0 ? "+" : "") + change.toFixed(1) + " pts";
    };
  }

  function points(fraction, signed) {
    const text = (100 * fraction).toFixed(1);
    return (signed && fraction > 0 ? "+" : "") + text + (signed ? " pts" : "%");
  }

  // A change of value in the type's unit, with its sign: "+5.00 MiB", "−1.00 MiB", "0 B".
  function signed(value, type) {
    return (value > 0 ? "+" : value < 0 ? "−" : "") + FlameUnits.format(Math.abs(value), type);
  }

  function diffRow(row, type) {
    const element = document.createElement("tr");
    element.dataset.function = row.function;
    element.dataset.selfChange = row.selfChange;
    element.dataset.change = row.change;
    element.dataset.by = row.by;
    // The change the row is ranked by (self or total) is coloured, and marked ~ within the noise.
    const mark = (by) => (by !== row.by ? "value" : "value ranked " + (row.noise ? "noise" : row.change > 0 ? "more" : "less"));
    const tilde = (noise) => (noise ? " ~" : "");
    // A level's rows in its unit (a leak's growth in bytes), others in shares of each side's total.
    const cells = type.snapshot
      ? [[row.function, ""], [signed(row.afterSelfValue - row.baseSelfValue, type), mark("self")],
         [FlameUnits.format(row.baseSelfValue, type), "value"], [FlameUnits.format(row.afterSelfValue, type), "value"],
         [signed(row.afterTotalValue - row.baseTotalValue, type), mark("total")], [FlameUnits.format(row.baseTotalValue, type), "value"],
         [FlameUnits.format(row.afterTotalValue, type), "value"]]
      : [[row.function, ""], [points(row.selfChange, true) + tilde(row.selfNoise), mark("self")],
         [points(row.baseSelf), "value"], [points(row.afterSelf), "value"], [points(row.totalChange, true) + tilde(row.totalNoise), mark("total")],
         [points(row.baseTotal), "value"], [points(row.afterTotal), "value"]];
    for (const [text, kind] of cells) {
      const cell = document.createElement("td");
      cell.textContent = text;
      if (kind) cell.className = kind;
      element.append(cell);
    }
    return element;
  }

  function heading(text) {
    const row = document.createElement("tr");
    row.className = "heading";
    const cell = document.createElement("td");
    cell.colSpan = 7;
    cell.textContent = text;
    row.append(cell);
    return row;
  }

  function renderDiffTable(result, type) {
    const more = result.rows.filter((row) => row.change > 0).slice(0, DIFF_ROWS);
    const less = result.rows.filter((row) => row.change < 0).reverse().slice(0, DIFF_ROWS);
    const described = FlameUnits.describe(type);
    document.getElementById("diff-more").replaceChildren(heading(described.more), ...more.map((row) => diffRow(row, type)));
    document.getElementById("diff-less").replaceChildren(heading(described.less), ...less.map((row) => diffRow(row, type)));
  }

  // The diff flame graph: drawn on the comparison's shape, coloured by the change of each frame's
  // share; returns false when a side is empty (then there is nothing to draw).
  function renderDiff(type) {
    const [base, after] = compareSides();
    const note = document.getElementById("diff-note");
    document.getElementById("diff-panel").hidden = false;
    const empty = document.getElementById("empty");
    if (!base || !after) {
      note.textContent = "";
      empty.textContent = "Pin a view first: it becomes the baseline, and what comes later the comparison.";
      empty.hidden = false;
      renderDiffTable({ rows: [] }, type);
      return;
    }
    const baseTotal = treeTotal(base.tree);
    const afterTotal = treeTotal(after.tree);
    const counts = type.unit === "count" && !type.snapshot;
    const compared = type.snapshot ? " · each process's latest reading on each side, compared by value" : " · shares of each side's own total";
    note.textContent = "(baseline " + base.label + ": " + FlameUnits.phrase(baseTotal, type) + " · comparison " + after.label + ": " +
      FlameUnits.phrase(afterTotal, type) + compared + (counts ? " · ~ within the sampling noise of these counts" : "") +
      " · a row is ranked by its bold change: self, or total where the function's own calls moved it)";
    document.getElementById("summary").textContent = data.host + " · diff · " + FlameUnits.phrase(afterTotal, type) + " against " + FlameUnits.phrase(baseTotal, type);
    renderDiffTable(FlameCompare.changes(base.tree, after.tree, counts, type.snapshot), type);
    if (!baseTotal || !afterTotal) {
      empty.textContent = (baseTotal ? "The comparison" : "The baseline") + " has no " + FlameUnits.describe(type).noun + " (yet).";
      empty.hidden = false;
      return;
    }
    empty.hidden = true;
    const children = FlameCompare.annotate(FlameCompare.mergeTrees([[], after.tree]), base.tree);
    const [baseOver, afterOver] = FlameCompare.denominators(baseTotal, afterTotal, type.snapshot);
    const scale = FlameCompare.scaleOf(children, baseOver, afterOver);
    document.getElementById("diff-legend").hidden = false;
    document.getElementById("diff-scale-text").textContent = type.snapshot
      ? "(" + signed(-scale * baseOver, type) + " to " + signed(scale * baseOver, type) + ")"
      : "(−" + (100 * scale).toFixed(1) + " to +" + (100 * scale).toFixed(1) + " pts of the total)";
    const root = { name: "comparison", value: afterTotal, base: baseTotal, libtype: "", children: children };
    chart = newChart(type)
      .setColorMapper((node) => FlameCompare.colour(FlameCompare.nodeChange(node.data, baseOver, afterOver), scale))
      .setLabelHandler(diffLabel(type, baseTotal, afterTotal));
    d3.select(chartElement).datum(root).call(chart);
    search();
  }

  // Every span attribute value the type's samples carry ("http.route=/checkout"), for the filter.
  function fillAttributeSelect(wanted) {
    const type = selectedType();
    const pairs = new Set();
    for (const process of type.processes) {
      for (const group of process.groups || []) {
        for (const [key, value] of Object.entries(group.attributes)) pairs.add(key + "=" + value);
      }
    }
    const sorted = [...pairs].sort();
    if (wanted.attribute && !pairs.has(wanted.attribute)) sorted.unshift(wanted.attribute);  // (a link's, before its data came)
    document.getElementById("attribute-control").hidden = sorted.length === 0;
    attributeSelect.replaceChildren(option(ALL, "All", wanted.attribute), ...sorted.map((pair) => option(pair, pair, wanted.attribute)));
    document.getElementById("span-control").hidden = !type.spans || type.spans.length === 0;
  }

  // The attribute filter as [key, value], or null.
  function wantedAttribute() {
    if (!attributeSelect.value) return null;
    const at = attributeSelect.value.indexOf("=");
    return [attributeSelect.value.slice(0, at), attributeSelect.value.slice(at + 1)];
  }

  function carries(attributes, wanted) {
    return !wanted || attributes[wanted[0]] === wanted[1];
  }

  function spanMatches(span, text) {
    const term = text.trim().toLowerCase();
    return !term || span.trace_id.startsWith(term) || span.span_id.startsWith(term);
  }

  // The type's listed spans that the filters select, heaviest first.
  function selectedSpans() {
    const processIds = new Set(selectedProcesses().map(processId));
    const wanted = wantedAttribute();
    return (selectedType().spans || []).filter((span) => processIds.has(processId(span)) && carries(span.attributes, wanted) && spanMatches(span, spanInput.value));
  }

  function selectedProcesses() {
    return selectedType().processes.filter((process) => {
      if (processSelect.value !== ALL && processId(process) !== processSelect.value) return false;
      if (containerSelect.value === NO_CONTAINER) return !process.container;
      return containerSelect.value === ALL || process.container === containerSelect.value;
    });
  }

  // A process's graph under the span filters: the spans typed, else the attribute's groups, else all.
  function processNode(process) {
    let parts = [process];
    if (spanInput.value.trim()) {
      const spans = selectedSpans();
      parts = spans.filter((span) => processId(span) === processId(process));
    } else if (wantedAttribute()) {
      parts = (process.groups || []).filter((group) => carries(group.attributes, wantedAttribute()));
    }
    const value = parts.reduce((sum, part) => sum + part.total, 0);
    return { name: processLabel(process), value: value, children: FlameCompare.mergeTrees(parts.map((part) => part.stacks)) };
  }

  // One process is its own root; several hang under "all", one child per process.
  function rootFor(nodes) {
    if (nodes.length === 1) return nodes[0];
    return { name: "all", value: nodes.reduce((sum, node) => sum + node.value, 0), children: nodes };
  }

  // The spans with the most samples among those selected; a click shows one span's graph.
  function renderSpans(type, total) {
    const panel = document.getElementById("spans-panel");
    const spans = selectedSpans();
    panel.hidden = !type.spans || type.spans.length === 0;
    const cut = data.spans_cut ? " · " + data.spans_cut + " spans past the window's cap are counted without their ids" : "";
    // Only the spans with the most samples come with the page: say so when the typed id finds none.
    const unmatched = spanInput.value.trim() && spans.length === 0 ? " · no span among the " + (type.spans || []).length +
      " with the most samples starts with that id" : "";
    document.getElementById("spans-note").textContent = "(" + Math.min(spans.length, SPANS_LISTED) + " of " + spans.length + " listed in the window)" + unmatched + cut;
    const rows = spans.slice(0, SPANS_LISTED).map((span) => {
      const row = document.createElement("tr");
      const cells = [[FlameUnits.format(span.total, type), "value"], [percent(span.total, total), "value"], [span.trace_id, "id"], [span.span_id, "id"],
                     [Object.entries(span.attributes).map(([key, value]) => key + "=" + value).join(", "), ""], [processLabel(span), ""]];
      for (const [text, kind] of cells) {
        const cell = document.createElement("td");
        cell.textContent = text;
        if (kind) cell.className = kind;
        row.append(cell);
      }
      if (spanInput.value.trim().toLowerCase() === span.span_id) row.className = "selected";
      row.addEventListener("click", () => {
        spanInput.value = span.span_id;
        writeFragment();
        render();
      });
      return row;
    });
    document.querySelector("#spans tbody").replaceChildren(...rows);
  }

  // -- timeline ---------------------------------------------------------------------------------

  const TIMELINE_HEIGHT = 72;
  const TIMELINE_MARGIN = 32;  // room for the first and last time labels
  const AXIS_HEIGHT = 18;

  // The selected processes' value in each segment of the type: [{segment, value}], oldest first.
  function timelineSeries(type) {
    const wanted = new Set(selectedProcesses().map((process) => type.processes.indexOf(process)));
    return (type.segments || []).map((segment) => {
      let value = 0;
      for (const [index, stacks] of segment.processes) {
        if (!wanted.has(index)) continue;
        for (const [, count] of stacks) value += count;
      }
      return { segment: segment, value: value };
    });
  }

  // The whole segments a drag from unix second a to b touches, as a range.
  function snapped(a, b) {
    const touched = (selectedType().segments || []).filter((segment) => segment.end_unix > a && segment.start_unix < b);
    if (!touched.length) return { from: a, to: b };
    return { from: touched[0].start_unix, to: touched[touched.length - 1].end_unix };
  }

  // Bars per segment over the window, the selected range (or in a time comparison, the
  // comparison; the baseline as a band) under a brush: dragging selects.
  function drawTimeline(type) {
    const panel = document.getElementById("timeline-panel");
    const series = timelineSeries(type);
    const mode = compareSelect.value;
    panel.hidden = series.length === 0 || mode === "resource";
    compareRangeButton.hidden = !range || Boolean(mode);
    wholeWindowButton.hidden = !range || Boolean(mode);
    const svg = d3.select(timelineElement);
    svg.selectAll("*").remove();
    if (panel.hidden) return;
    const width = Math.max(timelineElement.clientWidth || chartElement.clientWidth, 600);
    const end = Math.max(data.generated_unix, ...series.map((entry) => entry.segment.end_unix));  // (a clock set back)
    const x = d3.scaleLinear().domain([end - data.window_seconds, end]).range([TIMELINE_MARGIN, width - TIMELINE_MARGIN]);
    const largest = Math.max(1, ...series.map((entry) => entry.value));
    const y = d3.scaleLinear().domain([0, largest]).range([TIMELINE_HEIGHT - AXIS_HEIGHT, 2]);
    const shown = mode === "time" ? { from: +afterFrom.value, to: +afterTo.value } : range;
    // The selection as a band behind the bars (the baseline's too, in a comparison), not as the
    // brush's own: a drag that starts inside the brush's selection moves it, where a person
    // means to select anew.
    const band = (kind, from, to, title) => svg.append("rect").attr("class", kind).attr("x", x(from)).attr("y", 0)
      .attr("width", Math.max(1, x(to) - x(from))).attr("height", TIMELINE_HEIGHT - AXIS_HEIGHT).append("title").text(title);
    if (mode === "time") band("baseline-range", +baseFrom.value, +baseTo.value, "baseline " + clock(+baseFrom.value) + "–" + clock(+baseTo.value));
    if (shown) band("selected-range", shown.from, shown.to, (mode === "time" ? "comparison " : "selected ") + clock(shown.from) + "–" + clock(shown.to));
    svg.append("g").selectAll("rect").data(series).join("rect")
      .attr("class", (entry) => "bar" + (shown && !within(entry.segment, shown.from, shown.to) ? " outside" : ""))
      .attr("x", (entry) => x(entry.segment.start_unix)).attr("width", (entry) => Math.max(1, x(entry.segment.end_unix) - x(entry.segment.start_unix) - 1))
      .attr("y", (entry) => y(entry.value)).attr("height", (entry) => y(0) - y(entry.value))
      .attr("data-start", (entry) => entry.segment.start_unix).attr("data-end", (entry) => entry.segment.end_unix)
      .attr("data-value", (entry) => entry.value)
      .append("title").text((entry) => clock(entry.segment.start_unix) + ": " + FlameUnits.phrase(entry.value, type));
    svg.append("g").attr("class", "axis").attr("transform", "translate(0," + (TIMELINE_HEIGHT - AXIS_HEIGHT) + ")")
      .call(d3.axisBottom(x).ticks(Math.max(2, Math.floor(width / 110))).tickFormat(clock));
    const brush = d3.brushX().extent([[0, 0], [width, TIMELINE_HEIGHT - AXIS_HEIGHT]]).on("end", (event) => {
      if (!event.sourceEvent) return;
      brushed(event.selection && snapped(x.invert(event.selection[0]), x.invert(event.selection[1])));
    });
    svg.append("g").attr("class", "brush").call(brush);
    const total = series.reduce((sum, entry) => sum + entry.value, 0);
    const inRange = shown ? series.filter((entry) => within(entry.segment, shown.from, shown.to)).reduce((sum, entry) => sum + entry.value, 0) : total;
    document.getElementById("timeline-note").textContent = mode === "time" ? "Drag to pick the comparison; the band is the baseline."
      : range ? "Selected " + clock(range.from) + "–" + clock(range.to) + ": " + FlameUnits.phrase(inRange, type) + " of " + FlameUnits.phrase(total, type)
        : "Drag across the timeline to see a time range.";
  }

  // A drag ended: the range (null: a click, the whole window), or in a time comparison the
  // comparison's range.
  function brushed(selected) {
    if (compareSelect.value === "time") {
      if (!selected) return;
      fillOptions(afterFrom, [...afterFrom.options].map((o) => [o.value, o.text]), selected.from.toFixed(3), afterFrom.value);
      fillOptions(afterTo, [...afterTo.options].map((o) => [o.value, o.text]), selected.to.toFixed(3), afterTo.value);
    } else {
      range = selected;
    }
    showCompareControls();
    writeFragment();
    render();
  }

  // The range becomes the baseline of a time comparison; the rest of the window after it (or
  // before it, when it ends the window) the comparison until a drag picks another.
  function compareRange() {
    const segments = selectedType().segments || [];
    const after = segments.filter((segment) => segment.start_unix >= range.to);
    const before = segments.filter((segment) => segment.end_unix <= range.from);
    const other = after.length ? after : before;
    const wanted = { compare: "time", bfrom: range.from.toFixed(3), bto: range.to.toFixed(3),
                     afrom: other.length ? other[0].start_unix.toFixed(3) : "", ato: other.length ? other[other.length - 1].end_unix.toFixed(3) : "" };
    range = null;
    fillCompareControls({ ...wantedCompare(), ...wanted });
    showCompareControls();
    writeFragment();
    render();
  }

  // -- table ------------------------------------------------------------------------------------

  // Each function's self and total value in the graph's nodes, sorted, narrowed by the search;
  // the first row is everything the graph holds (100%).
  function renderTable(nodes, type) {
    const panel = document.getElementById("table-panel");
    panel.hidden = viewSelect.value === "graph" || Boolean(compareSelect.value) || nodes.length === 0;
    if (panel.hidden) return;
    const children = FlameCompare.mergeTrees(nodes.map((node) => node.children));
    const tally = FlameCompare.tally(children, { leafSelf: true, namesakes: FlameCompare.namesakes(children) });
    const total = tally.total;
    const term = searchInput.value.toLowerCase();
    const rows = [...tally.totals.keys()].filter((name) => !term || name.toLowerCase().includes(term))
      .map((name) => ({ function: name, self: tally.self.get(name) || 0, total: tally.totals.get(name) }));
    const key = tableSort === "function" ? null : tableSort;
    rows.sort((a, b) => key ? b[key] - a[key] || (a.function < b.function ? -1 : 1) : (a.function < b.function ? -1 : 1));
    const cells = (row, root) => [[root ? "all (" + nodes.length + (nodes.length === 1 ? " process)" : " processes)") : row.function, "function"],
      [FlameUnits.format(row.self, type), "value"], [percent(row.self, total), "value"],
      [FlameUnits.format(row.total, type), "value"], [percent(row.total, total), "value"]];
    const line = (row, root) => {
      const element = document.createElement("tr");
      if (root) element.className = "root";
      else element.dataset.function = row.function;
      for (const [text, kind] of cells(row, root)) {
        const cell = document.createElement("td");
        cell.textContent = text;
        cell.className = kind;
        element.append(cell);
      }
      return element;
    };
    document.querySelector("#functions tbody").replaceChildren(line({ self: 0, total: total }, true), ...rows.slice(0, TABLE_ROWS).map((row) => line(row, false)));
    for (const header of document.querySelectorAll("#functions th")) header.classList.toggle("sorted", header.dataset.sort === tableSort && header.textContent.indexOf("%") < 0);
    document.getElementById("table-note").textContent = "(" + Math.min(rows.length, TABLE_ROWS) + " of " + rows.length +
      (term ? " matching the search" : "") + " · self: a frame's own value, as the graph draws it; total: with it anywhere on the stack)";
  }

  function summary(nodes, type) {
    const total = nodes.reduce((sum, node) => sum + node.value, 0);
    const minutes = data.window_seconds / 60;
    const window = minutes >= 1 ? minutes.toFixed(minutes % 1 ? 1 : 0) + " min" : data.window_seconds + " s";
    const when = new Date(data.generated_unix * 1000).toLocaleTimeString();
    const span = type.snapshot ? "each process's latest reading in the last " : "last ";
    const selected = range ? clock(range.from) + "–" + clock(range.to) + " of the " : "";
    return data.host + " · " + selected + span + window + " up to " + when + " · " + FlameUnits.phrase(total, type);
  }

  // d3-flame-graph's own texts count "samples"; these say the value in the type's unit.
  function frameLabel(type) {
    return (node) => node.data.name + " (" + (100 * (node.x1 - node.x0)).toFixed(3) + "%, " + FlameUnits.phrase(node.value, type) + ")";
  }

  function searchSummary(type) {
    return (results, matched, total) => {
      searchText = "search: " + FlameUnits.format(matched, type) + " of " + FlameUnits.format(total, type) +
        " total " + FlameUnits.describe(type).noun + " (" + percent(matched, total) + ")";
      showDetails(null);
    };
  }

  // The hovered frame's label, else the search's result (d3-flame-graph passes null on mouseout).
  function showDetails(text) {
    details.textContent = text || searchText;
  }

  // Siblings left to right by value, so the hot path runs along the left edge.
  function heaviestFirst(a, b) {
    return b.data.value - a.data.value || (a.data.name < b.data.name ? -1 : 1);
  }

  // Plain substring match: a regex would throw on a half-typed pattern such as "foo(".
  function matches(node, term) {
    return Boolean(term) && node.data.name.toLowerCase().includes(term.toLowerCase());
  }

  // A fresh chart each time: d3-flame-graph fixes its height on the first render. Root on top (an
  // icicle, as Grafana and Pyroscope draw it): the processes and the hot paths stay in view however
  // deep the deepest stack goes.
  function newChart(type) {
    return flamegraph.default()
      .inverted(true)
      .width(Math.max(chartElement.clientWidth, 600))
      .cellHeight(18)
      .minFrameSize(1)
      .sort(heaviestFirst)
      .transitionDuration(250)
      .setDetailsHandler(showDetails)
      .setSearchMatch(matches)
      .setLabelHandler(frameLabel(type))
      .setSearchHandler(searchSummary(type))
      .onClick(() => { if (autoRefresh) autoRefresh.checked = false; });  // keep a zoomed view still
  }

  // What the graph and the table show: the selected processes over the window, or in the range.
  function shownNodes() {
    return range ? rangeNodes(range.from, range.to) : selectedProcesses().map(processNode).filter((node) => node.value > 0);
  }

  function render() {
    const type = selectedType();
    const described = FlameUnits.describe(type);
    document.getElementById("title").textContent = described.label + (compareSelect.value ? " diff flame graph" : " flame graph");
    document.title = document.getElementById("title").textContent + " · pycollector";
    renderSpans(type, selectedProcesses().reduce((sum, p) => sum + p.total, 0));
    chartElement.replaceChildren();
    chart = null;
    document.getElementById("diff-legend").hidden = true;
    chartElement.hidden = false;
    if (compareSelect.value) {
      document.getElementById("table-panel").hidden = true;
      renderDiff(type);
      drawTimeline(type);
      return;
    }
    document.getElementById("diff-panel").hidden = true;
    const nodes = shownNodes();
    document.getElementById("summary").textContent = summary(nodes, type);
    const empty = document.getElementById("empty");
    empty.textContent = range ? "No samples of the selected processes in this time range." : described.empty;
    empty.hidden = nodes.length > 0;
    drawTimeline(type);
    renderTable(nodes, type);
    chartElement.hidden = viewSelect.value === "table";
    if (nodes.length === 0 || chartElement.hidden) return;
    chart = newChart(type);
    d3.select(chartElement).datum(rootFor(nodes)).call(chart);
    search();
  }

  function search() {
    if (!chart) return;
    if (searchInput.value) chart.search(searchInput.value);
    else {
      searchText = "";
      chart.clear();
    }
  }

  async function refresh() {
    const response = await fetch("data.json", { cache: "no-store" });
    if (!response.ok) throw new Error("data.json: HTTP " + response.status);
    data = await response.json();
    fillSelects({ type: wantedType, process: processSelect.value, container: containerSelect.value, attribute: attributeSelect.value, ...wantedCompare() });
    render();
  }

  function showRefreshError(error) {
    details.textContent = "Could not refresh: " + error.message;
  }

  const initial = readFragment();
  // The type asked for (by the link, or chosen since): a link to off-CPU time opened before any
  // arrived shows CPU samples meanwhile, and off-CPU time once a refresh brings some.
  let wantedType = initial.type;
  pinAt = initial.pin;
  range = initial.from && initial.to && initial.to > initial.from ? { from: initial.from, to: initial.to } : null;
  viewSelect.value = initial.view;
  tableSort = ["function", "self", "total"].includes(initial.sort) ? initial.sort : "total";
  fillSelects(initial);
  searchInput.value = initial.search;
  spanInput.value = initial.span;
  // Another type has other processes: keep the process and container only where they still exist.
  typeSelect.addEventListener("change", () => {
    wantedType = typeSelect.value;
    fillProcessSelects({ process: processSelect.value, container: containerSelect.value, attribute: attributeSelect.value, ...wantedCompare() });
    writeFragment();
    render();
  });
  processSelect.addEventListener("change", () => { writeFragment(); render(); });
  containerSelect.addEventListener("change", () => { writeFragment(); render(); });
  attributeSelect.addEventListener("change", () => { writeFragment(); render(); });
  spanInput.addEventListener("input", () => { writeFragment(); render(); });
  searchInput.addEventListener("input", () => { writeFragment(); search(); renderTable(shownNodes(), selectedType()); });
  viewSelect.addEventListener("change", () => { writeFragment(); render(); });
  compareRangeButton.addEventListener("click", compareRange);
  wholeWindowButton.addEventListener("click", () => brushed(null));
  for (const header of document.querySelectorAll("#functions th")) {
    header.addEventListener("click", () => { tableSort = header.dataset.sort; writeFragment(); renderTable(shownNodes(), selectedType()); });
  }
  const compareChanged = () => { showCompareControls(); writeFragment(); render(); };
  for (const element of [compareSelect, baseFrom, baseTo, afterFrom, afterTo, baseValue, afterValue]) element.addEventListener("change", compareChanged);
  resourceKey.addEventListener("change", () => { fillResourceValues({}, resourceValues()); compareChanged(); });
  document.getElementById("pin").addEventListener("click", pinView);
  showCompareControls();
  render();

  if (live) {
    document.getElementById("refresh").addEventListener("click", () => refresh().catch(showRefreshError));
    setInterval(() => { if (autoRefresh.checked) refresh().catch(showRefreshError); }, AUTO_REFRESH_MS);
  }
})();
