// Two profiles compared, as the page draws them: call trees built and merged, the comparison's
// tree annotated with the baseline's values, each function's self and total share on both sides,
// and the colour of a change. No DOM here, so node can check it without a browser
// (tests/test_flamegraph_diff.py); page.js draws what this computes.
//
// Shares are each side's own (a value over its side's total): two time ranges of different
// lengths, or a busy and a quiet version, compare fairly. Levels (the live heap's in-use bytes, a
// reading at a time rather than a count over it) are compared as they are: both sides over the
// larger side's total, so a function's change follows its change in value (a leak grows the
// level; its share of each side's own total would hide growth that every function shares). A function's self share is the part of
// the total spent with it as the innermost frame of the program's language (a Python process's
// samples end in the interpreter's C code: its developer reads `spin_heavy (app.py)`, not
// `_PyEval_EvalFrameDefault`), else the leaf; its total share, the part with it anywhere on the
// stack, once per stack however deep it recurses.
var FlameCompare = (function () {
  "use strict";

  // Frame types of code an interpreter or a JIT runs (as the profiling receiver marks them).
  const LANGUAGE_TYPES = new Set(["cpython", "jvm", "v8js"]);
  const LINE_SUFFIX = /:\d+\)$/;

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
    return asLists(root);
  }

  function asLists(map) {
    return [...map.values()].map((node) => ({ name: node.name, value: node.value, libtype: node.libtype, children: asLists(node.children) }));
  }

  // A call tree from [stack index, value] pairs, stacks being root-first frame indexes into frames.
  function treeOf(pairs, frames, stacks) {
    const root = new Map();
    for (const [stackIndex, value] of pairs) {
      let level = root;
      for (const frameIndex of stacks[stackIndex]) {
        const [name, libtype] = frames[frameIndex];
        const key = libtype + "\u0000" + name;
        let node = level.get(key);
        if (!node) level.set(key, node = { name: name, value: 0, libtype: libtype, children: new Map() });
        node.value += value;
        level = node.children;
      }
    }
    return asLists(root);
  }

  // The comparison's tree with, on each node, the value the baseline has at the same path
  // (`base`; 0 where the baseline never went). The diff is drawn on the comparison's shape.
  function annotate(afterChildren, baseChildren) {
    const pending = [[afterChildren, baseChildren]];
    while (pending.length) {
      const [nodes, baseNodes] = pending.pop();
      const byKey = new Map(baseNodes.map((node) => [node.libtype + "\u0000" + node.name, node]));
      for (const node of nodes) {
        const base = byKey.get(node.libtype + "\u0000" + node.name);
        node.base = base ? base.value : 0;
        pending.push([node.children, base ? base.children : []]);
      }
    }
    return afterChildren;
  }

  // How a function is listed: a language frame without its line, so a function is one row
  // whichever line its samples were on ("spin_heavy (app.py:16)" -> "spin_heavy (app.py)").
  function functionName(node) {
    return LANGUAGE_TYPES.has(node.libtype) ? node.name.replace(LINE_SUFFIX, ")") : node.name;
  }

  // The names (functionName) that the trees give to frames of more than one type: the kernel's
  // memcpy and libc's, a Go and a C function of one name (compare.py's kept_apart).
  function namesakes(...trees) {
    const kinds = new Map();
    const pending = trees.flat();
    while (pending.length) {
      const node = pending.pop();
      const name = functionName(node);
      if (!kinds.has(name)) kinds.set(name, new Set());
      kinds.get(name).add(node.libtype || "native");
      pending.push(...node.children);
    }
    return new Set([...kinds].filter(([, found]) => found.size > 1).map(([name]) => name));
  }

  // A side's total and each function's self and total value, from its call tree. With leafSelf,
  // self is each frame's own value, as the graph draws it (the page's table), not the innermost
  // language frame's; and the owners under each function are not counted. A name in
  // options.namesakes is told apart by its frame type: "memcpy [kernel]".
  function tally(children, options) {
    const leafSelf = Boolean(options && options.leafSelf);
    const shared = (options && options.namesakes) || new Set();
    const nameOf = (node) => {
      const name = functionName(node);
      return shared.has(name) ? name + " [" + (node.libtype || "native") + "]" : name;
    };
    const self = new Map();
    const total = new Map();
    const onPath = new Map();  // how many frames of each function the current path holds
    const under = new Map();  // function -> self owner -> value of its stacks with that owner
    let sum = 0;
    // Entries: [node, innermost language function above it] to enter, or [null, name] to leave.
    const pending = children.map((node) => [node, null]).reverse();
    while (pending.length) {
      const [node, outerLanguage] = pending.pop();
      if (node === null) {
        onPath.set(outerLanguage, onPath.get(outerLanguage) - 1);
        continue;
      }
      const name = nameOf(node);
      if (!onPath.get(name)) total.set(name, (total.get(name) || 0) + node.value);
      onPath.set(name, (onPath.get(name) || 0) + 1);
      const language = LANGUAGE_TYPES.has(node.libtype) ? name : outerLanguage;
      const own = node.value - node.children.reduce((acc, child) => acc + child.value, 0);
      if (own > 0) {
        const owner = leafSelf ? name : language || name;
        self.set(owner, (self.get(owner) || 0) + own);
        sum += own;
        if (!leafSelf) for (const [function_, frames] of onPath) {
          if (!frames) continue;
          if (!under.has(function_)) under.set(function_, new Map());
          const owners = under.get(function_);
          owners.set(owner, (owners.get(owner) || 0) + own);
        }
      }
      pending.push([null, name]);
      for (let i = node.children.length - 1; i >= 0; i--) pending.push([node.children[i], language]);
    }
    return { total: sum, self: self, totals: total, under: under };
  }

  const MIN_CALLER_CHANGE = 0.005;  // (of a share: half a point, as compare.py's)

  // Whether p1 -> p2 is within twice the standard error of a difference of two proportions
  // drawn from n1 and n2 samples (no judgement when the values are not sample counts).
  function withinNoise(p1, p2, n1, n2) {
    if (!n1 || !n2) return false;
    const error = Math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2);
    return Math.abs(p2 - p1) <= 2 * error;
  }

  // What each side's values are divided by: its own total, or for levels the larger total.
  function denominators(baseTotal, afterTotal, levels) {
    return levels ? [Math.max(baseTotal, afterTotal), Math.max(baseTotal, afterTotal)] : [baseTotal, afterTotal];
  }

  // Every function of either side with both sides' shares (over denominators()) and values, the
  // largest increase (of self or total: row.by) first. countsSamples: the values count samples, so the noise of the
  // counts can be judged (not for levels, whose shares are not proportions of a side's samples).
  function changes(baseChildren, afterChildren, countsSamples, levels) {
    const shared = namesakes(baseChildren, afterChildren);
    const base = tally(baseChildren, { namesakes: shared });
    const after = tally(afterChildren, { namesakes: shared });
    const [baseOver, afterOver] = denominators(base.total, after.total, levels);
    const value = (map, name) => map.get(name) || 0;
    const share = (map, name, over) => over ? value(map, name) / over : 0;
    const names = new Set([...base.totals.keys(), ...after.totals.keys()]);
    // The part of a function's total change no callee's own change explains (compare.py's
    // caller_change): of each self owner's part under it, the owner's change in the share of its
    // self time this function's stacks held is taken out.
    const callerChange = (name) => {
      const baseUnder = base.under.get(name) || new Map();
      const afterUnder = after.under.get(name) || new Map();
      let rest = 0;
      for (const owner of new Set([...baseUnder.keys(), ...afterUnder.keys()])) {
        const bu = baseUnder.get(owner) || 0;
        const au = afterUnder.get(owner) || 0;
        const bo = value(base.self, owner);
        const ao = value(after.self, owner);
        const held = bo ? bu / bo : ao ? au / ao : 0;
        const ownChange = (afterOver ? ao / afterOver : 0) - (baseOver ? bo / baseOver : 0);
        rest += (afterOver ? au / afterOver : 0) - (baseOver ? bu / baseOver : 0) - held * ownChange;
      }
      return rest;
    };
    const rows = [...names].map((name) => {
      const row = {
        function: name,
        baseSelf: share(base.self, name, baseOver), afterSelf: share(after.self, name, afterOver),
        baseTotal: share(base.totals, name, baseOver), afterTotal: share(after.totals, name, afterOver),
        baseSelfValue: value(base.self, name), afterSelfValue: value(after.self, name),
        baseTotalValue: value(base.totals, name), afterTotalValue: value(after.totals, name),
      };
      row.selfChange = row.afterSelf - row.baseSelf;
      row.totalChange = row.afterTotal - row.baseTotal;
      const judged = Boolean(countsSamples && !levels);
      row.selfNoise = judged && withinNoise(row.baseSelf, row.afterSelf, base.total, after.total);
      row.totalNoise = judged && withinNoise(row.baseTotal, row.afterTotal, base.total, after.total);
      // Ranked by total where its own part of the total change says more than its self change
      // (compare.py's Change.by): a caller that now calls an expensive helper more often.
      row.callerChange = callerChange(name);
      const own = Math.abs(row.callerChange);
      row.by = !row.totalNoise && own >= MIN_CALLER_CHANGE && own > (row.selfNoise ? 0 : Math.abs(row.selfChange)) ? "total" : "self";
      row.change = row.by === "total" ? row.totalChange : row.selfChange;
      row.noise = row.by === "total" ? row.totalNoise : row.selfNoise;
      return row;
    });
    // (of equal changes, a function's own before its callers', whose totals carry it)
    const callersLast = (row) => ((row.by === "total") === (row.change > 0) ? 1 : 0);
    rows.sort((a, b) => b.change - a.change || callersLast(a) - callersLast(b) || (a.function < b.function ? -1 : 1));
    return { baseTotal: base.total, afterTotal: after.total, rows: rows };
  }

  // The colour of a frame whose share changed by `change` (a fraction of the total), on a scale
  // that saturates at ±scale: red for more, blue for less, grey for none.
  const NONE = [224, 224, 224];
  const MORE = [214, 39, 40];
  const LESS = [31, 100, 200];
  function colour(change, scale) {
    const strength = scale > 0 ? Math.min(1, Math.abs(change) / scale) : 0;
    const towards = change > 0 ? MORE : LESS;
    const channel = (i) => Math.round(NONE[i] + (towards[i] - NONE[i]) * strength);
    return "rgb(" + channel(0) + "," + channel(1) + "," + channel(2) + ")";
  }

  // The change of share of a node of an annotated tree, given both sides' totals (for levels,
  // denominators()).
  function nodeChange(node, baseTotal, afterTotal) {
    return (afterTotal ? node.value / afterTotal : 0) - (baseTotal ? (node.base || 0) / baseTotal : 0);
  }

  // The largest change of share of any frame: the colour scale's end (at least a point).
  function scaleOf(children, baseTotal, afterTotal) {
    let largest = 0.01;
    const pending = [...children];
    while (pending.length) {
      const node = pending.pop();
      largest = Math.max(largest, Math.abs(nodeChange(node, baseTotal, afterTotal)));
      pending.push(...node.children);
    }
    return largest;
  }

  return { mergeTrees: mergeTrees, treeOf: treeOf, annotate: annotate, functionName: functionName, namesakes: namesakes, tally: tally,
           changes: changes, denominators: denominators, withinNoise: withinNoise, colour: colour, nodeChange: nodeChange, scaleOf: scaleOf };
})();

if (typeof module !== "undefined") module.exports = FlameCompare;
