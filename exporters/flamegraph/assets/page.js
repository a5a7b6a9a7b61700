// The flame graph page: shows one sample type (CPU samples, off-CPU time, ...), filters its
// per-process call trees, merges what is selected and hands the result to d3-flame-graph. The same
// code runs served live (refreshing from data.json) and as a saved file (data inlined, no server).
// The type, filters and search live in the URL fragment
// (#type=off_cpu&process=1234&container=abc&attr=http.route%3D%2Fcheckout&span=5b8e&search=spin),
// so a link or a saved file opens on the same view; the type is left out for the first (CPU when
// there is CPU data). Samples linked to spans can be narrowed to one span attribute's value
// (attr), or to the spans whose trace or span id starts with what is typed (span); the spans with
// the most samples are listed above the graph, a click showing one.
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
    const params = new URLSearchParams(location.hash.slice(1));
    return { type: params.get("type") || "", process: params.get("process") || ALL, container: params.get("container") || ALL,
             attribute: params.get("attr") || ALL, span: params.get("span") || "", search: params.get("search") || "" };
  }

  function writeFragment() {
    const params = new URLSearchParams();
    if (data.types.length && selectedType() !== data.types[0]) params.set("type", selectedType().id);
    if (processSelect.value) params.set("process", processSelect.value);
    if (containerSelect.value) params.set("container", containerSelect.value);
    if (attributeSelect.value) params.set("attr", attributeSelect.value);
    if (spanInput.value) params.set("span", spanInput.value);
    if (searchInput.value) params.set("search", searchInput.value);
    history.replaceState(null, "", "#" + params.toString());
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

  // Call trees side by side, as one: the same frame under the same caller adds up.
  function mergeTrees(trees) {
    if (trees.length === 1) return trees[0];
    const root = new Map();
    const pending = trees.map((children) => [root, children]);
    while (pending.length) {
      const [into, children] = pending.pop();
      for (const node of children) {
        const key = node.libtype + "\u0000" + node.name;
        let merged = into.get(key);
        if (!merged) into.set(key, merged = { name: node.name, value: 0, libtype: node.libtype, children: new Map() });
        merged.value += node.value;
        pending.push([merged.children, node.children]);
      }
    }
    const asLists = (map) => [...map.values()].map((node) => ({ name: node.name, value: node.value, libtype: node.libtype, children: asLists(node.children) }));
    return asLists(root);
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
    return { name: processLabel(process), value: value, children: mergeTrees(parts.map((part) => part.stacks)) };
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

  function summary(nodes, type) {
    const total = nodes.reduce((sum, node) => sum + node.value, 0);
    const minutes = data.window_seconds / 60;
    const window = minutes >= 1 ? minutes.toFixed(minutes % 1 ? 1 : 0) + " min" : data.window_seconds + " s";
    const when = new Date(data.generated_unix * 1000).toLocaleTimeString();
    return data.host + " · last " + window + " up to " + when + " · " + FlameUnits.phrase(total, type);
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

  function render() {
    const type = selectedType();
    const nodes = selectedProcesses().map(processNode).filter((node) => node.value > 0);
    const described = FlameUnits.describe(type);
    document.getElementById("title").textContent = described.label + " flame graph";
    document.title = described.label + " flame graph · pycollector";
    document.getElementById("summary").textContent = summary(nodes, type);
    renderSpans(type, selectedProcesses().reduce((sum, p) => sum + p.total, 0));
    const empty = document.getElementById("empty");
    empty.textContent = described.empty;
    empty.hidden = nodes.length > 0;
    chartElement.replaceChildren();
    if (nodes.length === 0) return;
    // A fresh chart each time: d3-flame-graph fixes its height on the first render. Root on
    // top (an icicle, as Grafana and Pyroscope draw it): the processes and the hot paths stay in
    // view however deep the deepest stack goes.
    chart = flamegraph.default()
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
    fillSelects({ type: wantedType, process: processSelect.value, container: containerSelect.value, attribute: attributeSelect.value });
    render();
  }

  function showRefreshError(error) {
    details.textContent = "Could not refresh: " + error.message;
  }

  const initial = readFragment();
  // The type asked for (by the link, or chosen since): a link to off-CPU time opened before any
  // arrived shows CPU samples meanwhile, and off-CPU time once a refresh brings some.
  let wantedType = initial.type;
  fillSelects(initial);
  searchInput.value = initial.search;
  spanInput.value = initial.span;
  // Another type has other processes: keep the process and container only where they still exist.
  typeSelect.addEventListener("change", () => {
    wantedType = typeSelect.value;
    fillProcessSelects({ process: processSelect.value, container: containerSelect.value, attribute: attributeSelect.value });
    writeFragment();
    render();
  });
  processSelect.addEventListener("change", () => { writeFragment(); render(); });
  containerSelect.addEventListener("change", () => { writeFragment(); render(); });
  attributeSelect.addEventListener("change", () => { writeFragment(); render(); });
  spanInput.addEventListener("input", () => { writeFragment(); render(); });
  searchInput.addEventListener("input", () => { writeFragment(); search(); });
  render();

  if (live) {
    document.getElementById("refresh").addEventListener("click", () => refresh().catch(showRefreshError));
    setInterval(() => { if (autoRefresh.checked) refresh().catch(showRefreshError); }, AUTO_REFRESH_MS);
  }
})();
