// The flame graph page: shows one sample type (CPU samples, off-CPU time, ...), filters its
// per-process call trees, merges what is selected and hands the result to d3-flame-graph. The same
// code runs served live (refreshing from data.json) and as a saved file (data inlined, no server).
// The type, filter and search live in the URL fragment
// (#type=off_cpu&process=1234&container=abc&search=spin), so a link or a saved file opens on the
// same view; the type is left out for the first (CPU when there is CPU data).
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
    return { type: params.get("type") || "", process: params.get("process") || ALL, container: params.get("container") || ALL, search: params.get("search") || "" };
  }

  function writeFragment() {
    const params = new URLSearchParams();
    if (data.types.length && selectedType() !== data.types[0]) params.set("type", selectedType().id);
    if (processSelect.value) params.set("process", processSelect.value);
    if (containerSelect.value) params.set("container", containerSelect.value);
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
  }

  function selectedProcesses() {
    return selectedType().processes.filter((process) => {
      if (processSelect.value !== ALL && processId(process) !== processSelect.value) return false;
      if (containerSelect.value === NO_CONTAINER) return !process.container;
      return containerSelect.value === ALL || process.container === containerSelect.value;
    });
  }

  function processNode(process) {
    return { name: processLabel(process), value: process.total, children: process.stacks };
  }

  // One process is its own root; several hang under "all", one child per process.
  function rootFor(processes) {
    if (processes.length === 1) return processNode(processes[0]);
    return { name: "all", value: processes.reduce((sum, p) => sum + p.total, 0), children: processes.map(processNode) };
  }

  function summary(processes, type) {
    const total = processes.reduce((sum, p) => sum + p.total, 0);
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
    const processes = selectedProcesses();
    const described = FlameUnits.describe(type);
    document.getElementById("title").textContent = described.label + " flame graph";
    document.title = described.label + " flame graph · pycollector";
    document.getElementById("summary").textContent = summary(processes, type);
    const empty = document.getElementById("empty");
    empty.textContent = described.empty;
    empty.hidden = processes.length > 0;
    chartElement.replaceChildren();
    if (processes.length === 0) return;
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
    d3.select(chartElement).datum(rootFor(processes)).call(chart);
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
    fillSelects({ type: wantedType, process: processSelect.value, container: containerSelect.value });
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
  // Another type has other processes: keep the process and container only where they still exist.
  typeSelect.addEventListener("change", () => {
    wantedType = typeSelect.value;
    fillProcessSelects({ process: processSelect.value, container: containerSelect.value });
    writeFragment();
    render();
  });
  processSelect.addEventListener("change", () => { writeFragment(); render(); });
  containerSelect.addEventListener("change", () => { writeFragment(); render(); });
  searchInput.addEventListener("input", () => { writeFragment(); search(); });
  render();

  if (live) {
    document.getElementById("refresh").addEventListener("click", () => refresh().catch(showRefreshError));
    setInterval(() => { if (autoRefresh.checked) refresh().catch(showRefreshError); }, AUTO_REFRESH_MS);
  }
})();
