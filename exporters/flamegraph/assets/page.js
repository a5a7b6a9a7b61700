// The flame graph page: filters the per-process call trees, merges what is selected and hands the
// result to d3-flame-graph. The same code runs served live (refreshing from data.json) and as a
// saved file (data inlined, no server). The filter and search live in the URL fragment
// (#process=1234&container=abc&search=spin), so a link or a saved file opens on the same view.
(function () {
  "use strict";

  const AUTO_REFRESH_MS = 10000;
  const ALL = "";
  const NO_CONTAINER = "-";
  const live = document.body.dataset.live === "true";
  let data = JSON.parse(document.getElementById("profile-data").textContent);
  let chart = null;

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

  function readFragment() {
    const params = new URLSearchParams(location.hash.slice(1));
    return { process: params.get("process") || ALL, container: params.get("container") || ALL, search: params.get("search") || "" };
  }

  function writeFragment() {
    const params = new URLSearchParams();
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

  // Rebuilds both selects from the current data, keeping what was selected when it still exists.
  function fillSelects(wanted) {
    const total = data.processes.reduce((sum, p) => sum + p.samples, 0);
    processSelect.replaceChildren(option(ALL, "All processes (" + data.processes.length + ")", wanted.process));
    for (const process of data.processes) {
      processSelect.append(option(processId(process), processLabel(process) + " — " + percent(process.samples, total), wanted.process));
    }
    const containers = [...new Set(data.processes.map((p) => p.container).filter(Boolean))].sort();
    document.getElementById("container-control").hidden = containers.length === 0;
    containerSelect.replaceChildren(option(ALL, "All", wanted.container), option(NO_CONTAINER, "Host (no container)", wanted.container));
    for (const container of containers) {
      containerSelect.append(option(container, container.slice(0, 12), wanted.container));
    }
  }

  function selectedProcesses() {
    return data.processes.filter((process) => {
      if (processSelect.value !== ALL && processId(process) !== processSelect.value) return false;
      if (containerSelect.value === NO_CONTAINER) return !process.container;
      return containerSelect.value === ALL || process.container === containerSelect.value;
    });
  }

  function processNode(process) {
    return { name: processLabel(process), value: process.samples, children: process.stacks };
  }

  // One process is its own root; several hang under "all", one child per process.
  function rootFor(processes) {
    if (processes.length === 1) return processNode(processes[0]);
    return { name: "all", value: processes.reduce((sum, p) => sum + p.samples, 0), children: processes.map(processNode) };
  }

  function summary(processes) {
    const samples = processes.reduce((sum, p) => sum + p.samples, 0);
    const minutes = data.window_seconds / 60;
    const window = minutes >= 1 ? minutes.toFixed(minutes % 1 ? 1 : 0) + " min" : data.window_seconds + " s";
    const when = new Date(data.generated_unix * 1000).toLocaleTimeString();
    return data.host + " · last " + window + " up to " + when + " · " + samples + " samples";
  }

  // Siblings left to right by samples, so the hot path runs along the left edge.
  function heaviestFirst(a, b) {
    return b.data.value - a.data.value || (a.data.name < b.data.name ? -1 : 1);
  }

  // Plain substring match: a regex would throw on a half-typed pattern such as "foo(".
  function matches(node, term) {
    return Boolean(term) && node.data.name.toLowerCase().includes(term.toLowerCase());
  }

  function render() {
    const processes = selectedProcesses();
    document.getElementById("summary").textContent = summary(processes);
    document.getElementById("empty").hidden = processes.length > 0;
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
      .setDetailsElement(details)
      .setSearchMatch(matches)
      .onClick(() => { if (autoRefresh) autoRefresh.checked = false; });  // keep a zoomed view still
    d3.select(chartElement).datum(rootFor(processes)).call(chart);
    search();
  }

  function search() {
    if (!chart) return;
    if (searchInput.value) chart.search(searchInput.value);
    else chart.clear();
  }

  async function refresh() {
    const response = await fetch("data.json", { cache: "no-store" });
    if (!response.ok) throw new Error("data.json: HTTP " + response.status);
    data = await response.json();
    fillSelects({ process: processSelect.value, container: containerSelect.value });
    render();
  }

  function showRefreshError(error) {
    details.textContent = "Could not refresh: " + error.message;
  }

  const initial = readFragment();
  fillSelects(initial);
  searchInput.value = initial.search;
  processSelect.addEventListener("change", () => { writeFragment(); render(); });
  containerSelect.addEventListener("change", () => { writeFragment(); render(); });
  searchInput.addEventListener("input", () => { writeFragment(); search(); });
  render();

  if (live) {
    document.getElementById("refresh").addEventListener("click", () => refresh().catch(showRefreshError));
    setInterval(() => { if (autoRefresh.checked) refresh().catch(showRefreshError); }, AUTO_REFRESH_MS);
  }
})();
