"use strict";
(() => {
  const dagSvg = document.getElementById("dag");
  const SVG_NS = dagSvg.namespaceURI; // taken from the page, so the file holds no URL at all

  // ---------------------------------------------------------------- small DOM helpers
  function setAttrs(node, attrs) {
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined) node.setAttribute(key, String(value));
    }
    return node;
  }
  function html(tag, attrs, text) {
    const node = setAttrs(document.createElement(tag), attrs);
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function svg(tag, attrs, text) {
    const node = setAttrs(document.createElementNS(SVG_NS, tag), attrs);
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }
  function truncate(text, max) {
    text = String(text);
    return text.length > max ? text.slice(0, max - 1) + "\u2026" : text;
  }

  // ---------------------------------------------------------------- formatting
  function fmtDuration(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "\u2013";
    const s = Math.max(0, seconds);
    if (s === 0) return "0 s";
    if (s < 1e-3) return Math.round(s * 1e6) + " \u00b5s";
    if (s < 1) return (s * 1e3).toFixed(s < 0.1 ? 1 : 0) + " ms";
    if (s < 60) return s.toFixed(2) + " s";
    const minutes = Math.floor(s / 60);
    return minutes + "m " + String(Math.round(s - minutes * 60)).padStart(2, "0") + "s";
  }
  function fmtBytes(n) {
    if (n === null || n === undefined) return "\u2013";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let value = n;
    let unit = 0;
    while (value >= 1000 && unit < units.length - 1) {
      value /= 1000;
      unit += 1;
    }
    return (unit === 0 ? String(value) : value.toFixed(value < 10 ? 1 : 0)) + " " + units[unit];
  }
  function nodeName(node) {
    return node.role + "." + node.method;
  }

  // ---------------------------------------------------------------- analysis of one DAG
  // Everything the drawing needs, with times made relative to the step's start.
  function analyse(dag) {
    const nodes = dag.nodes || [];
    const edges = dag.edges || [];
    const byId = new Map(nodes.map((n) => [n.node_id, n]));
    const t0 = dag.started || 0;
    const stamps = [];
    for (const n of nodes) {
      for (const t of [n.created, n.ready, n.started, n.finished]) if (typeof t === "number") stamps.push(t);
    }
    const end = typeof dag.finished === "number" ? dag.finished : Math.max(t0, ...stamps);

    // When each node stopped: a failed node without a finish time ends with the step (or at its start).
    const nodeEnd = (n) => {
      if (typeof n.finished === "number") return n.finished;
      if (n.state === "failed") return typeof dag.finished === "number" ? dag.finished : n.started;
      if (n.state === "running") return end;
      return null;
    };
    const times = new Map();
    for (const n of nodes) {
      const stop = nodeEnd(n);
      const readyOrNow = typeof n.ready === "number" ? n.ready : n.state === "waiting" ? end : null;
      times.set(n.node_id, {
        created: n.created - t0,
        ready: typeof n.ready === "number" ? n.ready - t0 : null,
        started: typeof n.started === "number" ? n.started - t0 : null,
        end: typeof stop === "number" ? stop - t0 : null,
        run: typeof n.started === "number" && typeof stop === "number" ? stop - n.started : null,
        inputWait: readyOrNow === null ? null : readyOrNow - n.created,
        inputsPending: n.ready === null || n.ready === undefined,
        queued: typeof n.started === "number" && typeof n.ready === "number" ? n.started - n.ready : null,
      });
    }

    // Incoming edges and, per node, the input that arrived last: the one it waited for longest.
    const incoming = new Map(nodes.map((n) => [n.node_id, []]));
    const outgoing = new Map(nodes.map((n) => [n.node_id, []]));
    edges.forEach((e, i) => {
      if (!incoming.has(e.dst)) return;
      incoming.get(e.dst).push(i);
      if (e.src !== null && outgoing.has(e.src)) outgoing.get(e.src).push(i);
    });
    const arrival = (id) => {
      const t = times.get(id);
      return t && t.end !== null ? t.end : end - t0;
    };
    const slowest = new Map(); // node id -> edge index
    for (const n of nodes) {
      let best = null;
      for (const i of incoming.get(n.node_id)) {
        const e = edges[i];
        if (e.src === null || !byId.has(e.src) || e.src === e.dst) continue;
        if (best === null || arrival(e.src) > arrival(edges[best].src)) best = i;
      }
      if (best !== null) slowest.set(n.node_id, best);
    }

    // Critical path: from the node that finished last, follow slowest inputs back to a source.
    const criticalNodes = new Set();
    const criticalEdges = new Set();
    let last = null;
    for (const n of nodes) {
      const t = times.get(n.node_id);
      const key = t.end !== null ? t.end : t.created;
      if (last === null || key > last.key) last = { id: n.node_id, key: key };
    }
    let cursor = last ? last.id : null;
    while (cursor !== null && !criticalNodes.has(cursor)) {
      criticalNodes.add(cursor);
      const edgeIndex = slowest.get(cursor);
      if (edgeIndex === undefined) break;
      criticalEdges.add(edgeIndex);
      cursor = edges[edgeIndex].src;
    }

    return {
      dag, nodes, edges, byId, t0, duration: Math.max(0, end - t0), times, incoming, outgoing,
      slowest, criticalNodes, criticalEdges, depth: depths(nodes, edges, byId),
      criticalOrder: nodes.filter((n) => criticalNodes.has(n.node_id))
        .sort((a, b) => times.get(a.node_id).created - times.get(b.node_id).created ||
          (times.get(a.node_id).end || 0) - (times.get(b.node_id).end || 0)),
    };
  }

  // Column of each node: the longest path from a source (Kahn's order; a cycle just goes last).
  function depths(nodes, edges, byId) {
    const indegree = new Map(nodes.map((n) => [n.node_id, 0]));
    const next = new Map(nodes.map((n) => [n.node_id, []]));
    for (const e of edges) {
      if (e.src === null || !byId.has(e.src) || !byId.has(e.dst) || e.src === e.dst) continue;
      next.get(e.src).push(e.dst);
      indegree.set(e.dst, indegree.get(e.dst) + 1);
    }
    const depth = new Map(nodes.map((n) => [n.node_id, 0]));
    const queue = nodes.filter((n) => indegree.get(n.node_id) === 0).map((n) => n.node_id);
    const seen = new Set();
    while (queue.length) {
      const id = queue.shift();
      seen.add(id);
      for (const dst of next.get(id)) {
        depth.set(dst, Math.max(depth.get(dst), depth.get(id) + 1));
        indegree.set(dst, indegree.get(dst) - 1);
        if (indegree.get(dst) === 0) queue.push(dst);
      }
    }
    const deepest = Math.max(0, ...depth.values());
    for (const n of nodes) if (!seen.has(n.node_id)) depth.set(n.node_id, deepest + 1);
    return depth;
  }

  function describeNode(info, n) {
    const t = info.times.get(n.node_id);
    const lines = [
      nodeName(n) + "  [" + n.state + "]",
      "ran in: " + n.process + (n.attempts > 1 ? "  (attempts: " + n.attempts + ")" : ""),
      "run: " + fmtDuration(t.run) + "   waiting for inputs: " + fmtDuration(t.inputWait) +
        (t.inputsPending ? " (still pending)" : "") + "   queued: " + fmtDuration(t.queued),
      "declared +" + fmtDuration(t.created) + ", ready +" + fmtDuration(t.ready) + ", started +" +
        fmtDuration(t.started) + ", ended +" + fmtDuration(t.end),
    ];
    const slow = info.slowest.get(n.node_id);
    if (slow !== undefined) {
      const e = info.edges[slow];
      lines.push("waited longest for: " + nodeName(info.byId.get(e.src)) + " (" + e.channel + ", ended +" +
        fmtDuration(info.times.get(e.src).end) + ")");
    }
    for (const i of info.incoming.get(n.node_id)) {
      const e = info.edges[i];
      const from = e.src === null ? "driver" : info.byId.has(e.src) ? nodeName(info.byId.get(e.src)) : "#" + e.src;
      lines.push("  in: " + e.channel + " \u00b7 " + fmtBytes(e.nbytes) + " from " + from + " (" + e.transport + ")");
    }
    if (n.error) lines.push("error: " + n.error);
    else if (n.state === "failed") lines.push("failed (no error message)");
    return lines;
  }

  // ---------------------------------------------------------------- DAG drawing
  const NODE_W = 210;
  const NODE_H = 74;
  const GAP_X = 150;
  const GAP_Y = 28;
  const PAD = 20;
  const DRIVER_W = 150;
  const TOP = 12; // room above the first row for driver stubs

  function arrowMarker(id, color) {
    const marker = svg("marker", {
      id: id, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 9, markerHeight: 9,
      markerUnits: "userSpaceOnUse", orient: "auto",
    });
    marker.appendChild(svg("path", { d: "M0,0 L10,5 L0,10 z", fill: color }));
    return marker;
  }

  function layoutDag(info) {
    const hasDriver = info.edges.some((e) => e.src === null && info.depth.get(e.dst) === 0);
    const columns = [];
    for (const n of info.nodes) {
      const d = info.depth.get(n.node_id);
      (columns[d] = columns[d] || []).push(n);
    }
    const x0 = PAD + (hasDriver ? DRIVER_W : 0);
    const rows = Math.max(1, ...columns.map((c) => (c ? c.length : 0)));
    const height = TOP + PAD * 2 + rows * (NODE_H + GAP_Y) - GAP_Y + 14;
    const pos = new Map();
    columns.forEach((column, d) => {
      if (!column) return;
      column.sort((a, b) => a.created - b.created || a.node_id - b.node_id);
      const top = TOP + PAD + ((rows - column.length) * (NODE_H + GAP_Y)) / 2;
      column.forEach((n, i) => pos.set(n.node_id, { x: x0 + d * (NODE_W + GAP_X), y: top + i * (NODE_H + GAP_Y) }));
    });
    const width = x0 + Math.max(1, columns.length) * (NODE_W + GAP_X) - GAP_X + PAD;
    return { pos, width, height, hasDriver, driver: { x: PAD + 16, y: height / 2 } };
  }

  // Spread the ends of several edges along a box side, ordered by where the other end is.
  function anchorOffsets(edgeIndexes, otherY) {
    const sorted = edgeIndexes.slice().sort((a, b) => otherY(a) - otherY(b) || a - b);
    const offsets = new Map();
    sorted.forEach((i, k) => offsets.set(i, ((k + 1) / (sorted.length + 1) - 0.5) * (NODE_H - 16)));
    return offsets;
  }

  function drawDag(info, onSelect) {
    clear(dagSvg);
    const layout = layoutDag(info);
    setAttrs(dagSvg, { width: layout.width, height: layout.height, viewBox: "0 0 " + layout.width + " " + layout.height });
    const defs = svg("defs");
    defs.appendChild(arrowMarker("arrow-in-process", "#555"));
    defs.appendChild(arrowMarker("arrow-cross-process", "#8e44ad"));
    defs.appendChild(arrowMarker("arrow-critical", "#e8590c"));
    dagSvg.appendChild(defs);

    // Driver values for the first column come from one driver marker on the left; values for deeper
    // nodes get a small driver stub above the node, so no edge has to cross the whole DAG.
    const isStub = (e) => e.src === null && info.depth.get(e.dst) > 0;
    const srcPoint = (e) => (isStub(e) ? null : e.src === null ? layout.driver : layout.pos.get(e.src));
    const centerY = (p) => (p === layout.driver ? p.y : p.y + NODE_H / 2);
    const inOffsets = new Map();
    const outOffsets = new Map();
    for (const n of info.nodes) {
      const ins = info.incoming.get(n.node_id).filter((i) => srcPoint(info.edges[i]));
      for (const [i, o] of anchorOffsets(ins, (i) => centerY(srcPoint(info.edges[i])))) inOffsets.set(i, o);
      const outs = info.outgoing.get(n.node_id).filter((i) => layout.pos.has(info.edges[i].dst));
      for (const [i, o] of anchorOffsets(outs, (i) => centerY(layout.pos.get(info.edges[i].dst)))) outOffsets.set(i, o);
    }

    const edgeLayer = svg("g", { class: "edges" });
    const labelLayer = svg("g", { class: "edge-labels" });
    const pairCount = new Map();
    info.edges.forEach((e, i) => {
      const from = srcPoint(e);
      const to = layout.pos.get(e.dst);
      if (!from || !to) return;
      const sx = from === layout.driver ? from.x + 16 : from.x + NODE_W;
      const sy = from === layout.driver ? from.y : from.y + NODE_H / 2 + (outOffsets.get(i) || 0);
      const tx = to.x;
      const ty = to.y + NODE_H / 2 + (inOffsets.get(i) || 0);
      const dx = Math.max(30, (tx - sx) / 2);
      const transport = e.transport === "cross-process" ? "cross-process" : "in-process";
      const critical = info.criticalEdges.has(i);
      const slowest = info.slowest.get(e.dst) === i;
      const cls = ["edge", transport, slowest ? "slowest" : "", critical ? "critical" : ""].join(" ").trim();
      const path = svg("path", {
        d: "M" + sx + "," + sy + " C" + (sx + dx) + "," + sy + " " + (tx - dx) + "," + ty + " " + tx + "," + ty,
        class: cls, "marker-end": "url(#arrow-" + (critical ? "critical" : transport) + ")",
        "data-src": e.src === null ? "driver" : e.src, "data-dst": e.dst,
      });
      const fromName = e.src === null ? "driver" : nodeName(info.byId.get(e.src));
      path.appendChild(svg("title", {}, e.channel + " \u00b7 " + fmtBytes(e.nbytes) + " (" + e.transport + ")\n" +
        fromName + " \u2192 " + nodeName(info.byId.get(e.dst)) + (slowest ? "\nslowest input of its target" : "")));
      edgeLayer.appendChild(path);
      // Labels of parallel edges between the same pair are stacked instead of overprinted.
      const pair = String(e.src) + ">" + e.dst;
      const k = pairCount.get(pair) || 0;
      pairCount.set(pair, k + 1);
      labelLayer.appendChild(svg("text", {
        x: (sx + tx) / 2, y: (sy + ty) / 2 - 4 + k * 13, "text-anchor": "middle", class: "edge-label " + transport,
      }, truncate(e.channel, 22) + " \u00b7 " + fmtBytes(e.nbytes)));
    });
    dagSvg.appendChild(edgeLayer);

    if (layout.hasDriver) {
      const g = svg("g", { class: "driver" });
      g.appendChild(svg("circle", { cx: layout.driver.x, cy: layout.driver.y, r: 16 }));
      g.appendChild(svg("text", { x: layout.driver.x, y: layout.driver.y + 32, "text-anchor": "middle" }, "driver"));
      g.appendChild(svg("title", {}, "values given by the driver program"));
      dagSvg.appendChild(g);
    }

    for (const n of info.nodes) {
      const stubs = info.incoming.get(n.node_id).map((i) => info.edges[i]).filter(isStub);
      if (stubs.length) dagSvg.appendChild(drawDriverStub(stubs, layout.pos.get(n.node_id)));
      dagSvg.appendChild(drawNode(info, n, layout.pos.get(n.node_id), onSelect));
    }
    dagSvg.appendChild(labelLayer);
  }

  function drawDriverStub(edges, p) {
    const transport = edges.some((e) => e.transport === "cross-process") ? "cross-process" : "in-process";
    const label = edges.map((e) => truncate(e.channel, 18) + " \u00b7 " + fmtBytes(e.nbytes)).join(", ");
    const g = svg("g", { class: "driver stub", "data-dst": edges[0].dst });
    g.appendChild(svg("circle", { cx: p.x + 14, cy: p.y - 18, r: 4 }));
    g.appendChild(svg("path", {
      d: "M" + (p.x + 14) + "," + (p.y - 14) + " L" + (p.x + 14) + "," + p.y,
      class: "edge " + transport, "marker-end": "url(#arrow-" + transport + ")", "data-src": "driver",
    }));
    g.appendChild(svg("text", { x: p.x + 24, y: p.y - 9, class: "edge-label " + transport }, "driver: " + truncate(label, 40)));
    g.appendChild(svg("title", {}, edges.map((e) => "driver \u2192 " + e.channel + " \u00b7 " + fmtBytes(e.nbytes) +
      " (" + e.transport + ")").join("\n")));
    return g;
  }

  function drawNode(info, n, p, onSelect) {
    const t = info.times.get(n.node_id);
    const critical = info.criticalNodes.has(n.node_id);
    const g = svg("g", {
      class: "node state-" + n.state + (critical ? " critical" : ""), "data-node-id": n.node_id,
      transform: "translate(" + p.x + "," + p.y + ")", tabindex: 0,
    });
    g.appendChild(svg("rect", { class: "box", width: NODE_W, height: NODE_H, rx: 6, ry: 6 }));
    g.appendChild(svg("text", { x: 10, y: 18, class: "role" },
      truncate(n.role, 22) + (n.attempts > 1 ? "  \u00d7" + n.attempts + " attempts" : "")));
    g.appendChild(svg("text", { x: 10, y: 34 }, truncate(n.method, 30)));
    const wait = t.inputsPending && n.state === "waiting" ? "inputs pending" : "inputs " + fmtDuration(t.inputWait);
    g.appendChild(svg("text", { x: 10, y: 51 }, "run " + fmtDuration(t.run) + " \u00b7 " + wait));
    if (n.state === "failed") {
      g.appendChild(svg("text", { x: 10, y: 67, class: "err" }, "\u26a0 " + truncate(n.error || "failed", 30)));
    } else if (n.process && n.process !== "driver") {
      g.appendChild(svg("text", { x: 10, y: 67, class: "proc" }, truncate(n.process, 32)));
    }
    g.appendChild(svg("title", {}, describeNode(info, n).join("\n")));
    g.addEventListener("click", () => onSelect(n.node_id));
    g.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") onSelect(n.node_id);
    });
    return g;
  }

  // ---------------------------------------------------------------- timeline (Gantt)
  const LABEL_W = 150;
  const LANE_H = 20;
  const AXIS_H = 24;
  const TL_WIDTH = 1100;

  function niceStep(span, ticks) {
    const raw = span / ticks;
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * power >= raw) return m * power;
    return 10 * power;
  }

  // Per role, put nodes whose [declared, ended] intervals overlap on separate lanes.
  function lanes(info) {
    const order = info.nodes.slice().sort((a, b) =>
      info.depth.get(a.node_id) - info.depth.get(b.node_id) || a.created - b.created || a.node_id - b.node_id);
    const roles = new Map();
    for (const n of order) {
      if (!roles.has(n.role)) roles.set(n.role, []);
      const t = info.times.get(n.node_id);
      const stop = t.end !== null ? t.end : info.duration;
      const laneEnds = roles.get(n.role);
      let lane = laneEnds.findIndex((laneEnd) => laneEnd.end <= t.created + 1e-9);
      if (lane < 0) {
        lane = laneEnds.length;
        laneEnds.push({ end: stop, nodes: [] });
      }
      laneEnds[lane].end = stop;
      laneEnds[lane].nodes.push(n);
    }
    return roles;
  }

  function drawTimeline(info, svgNode, onSelect) {
    clear(svgNode);
    const roles = lanes(info);
    let laneCount = 0;
    for (const laneList of roles.values()) laneCount += Math.max(1, laneList.length);
    const height = AXIS_H + laneCount * LANE_H + roles.size * 6 + 10;
    setAttrs(svgNode, { width: TL_WIDTH, height: height, viewBox: "0 0 " + TL_WIDTH + " " + height });
    const defs = svg("defs");
    const hatch = svg("pattern", { id: "hatch", patternUnits: "userSpaceOnUse", width: 6, height: 6, patternTransform: "rotate(45)" });
    hatch.appendChild(svg("rect", { width: 6, height: 6, fill: "#fff8e0" }));
    hatch.appendChild(svg("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#e0b030", "stroke-width": 2 }));
    defs.appendChild(hatch);
    svgNode.appendChild(defs);

    const span = info.duration > 0 ? info.duration : 1e-3;
    const plotW = TL_WIDTH - LABEL_W - PAD;
    const x = (t) => LABEL_W + (Math.min(Math.max(t, 0), span) / span) * plotW;
    const step = niceStep(span, 8);
    for (let tick = 0; tick <= span + 1e-12; tick += step) {
      svgNode.appendChild(svg("line", { x1: x(tick), y1: AXIS_H - 6, x2: x(tick), y2: height, class: "grid" }));
      svgNode.appendChild(svg("text", { x: x(tick), y: AXIS_H - 10, "text-anchor": "middle" }, fmtDuration(tick)));
    }

    let y = AXIS_H;
    for (const [role, laneList] of roles) {
      const rowHeight = Math.max(1, laneList.length) * LANE_H + 6;
      svgNode.appendChild(svg("text", { x: 6, y: y + rowHeight / 2 + 4, class: "row-label" }, truncate(role, 20)));
      laneList.forEach((lane, k) => {
        for (const n of lane.nodes) svgNode.appendChild(drawBars(info, n, x, y + 3 + k * LANE_H, onSelect));
      });
      y += rowHeight;
      svgNode.appendChild(svg("line", { x1: 0, y1: y, x2: TL_WIDTH, y2: y, class: "row-sep" }));
    }
  }

  function drawBars(info, n, x, top, onSelect) {
    const t = info.times.get(n.node_id);
    const g = svg("g", { class: "bars", "data-node-id": n.node_id });
    const h = LANE_H - 4;
    const bar = (from, to, attrs) => {
      if (from === null || to === null || to < from) return;
      g.appendChild(svg("rect", Object.assign({ x: x(from), y: top, width: Math.max(1, x(to) - x(from)), height: h }, attrs)));
    };
    // A node whose inputs never arrived waited for them until it failed or the step ended.
    const stillWaiting = n.state === "waiting" || (n.state === "failed" && t.started === null);
    const readyAt = t.ready !== null ? t.ready : stillWaiting ? (t.end !== null ? t.end : info.duration) : null;
    bar(t.created, readyAt, { fill: "url(#hatch)", class: "bar-inputs" });
    bar(t.ready, t.started !== null ? t.started : n.state === "waiting" ? info.duration : null, { class: "bar-queued" });
    const critical = info.criticalNodes.has(n.node_id) ? " critical" : "";
    bar(t.started, t.end, { class: "bar state-" + n.state + critical });
    if (t.started !== null && t.end !== null && x(t.end) - x(t.started) > 7 * n.method.length + 8) {
      g.appendChild(svg("text", { x: x(t.started) + 4, y: top + h - 4, class: "bar-label" }, n.method));
    }
    g.appendChild(svg("title", {}, describeNode(info, n).join("\n")));
    g.addEventListener("click", () => onSelect(n.node_id));
    return g;
  }

  // ---------------------------------------------------------------- page sections
  function renderHeader(data) {
    const meta = document.getElementById("meta");
    for (const [key, value] of Object.entries(data.meta || {})) {
      meta.appendChild(html("dt", {}, key));
      meta.appendChild(html("dd", {}, value));
    }
    const kept = (data.dags || []).length;
    const total = data.dag_count || 0;
    document.getElementById("overview").textContent = total === 0 ? "No steps were recorded." :
      total + " step" + (total === 1 ? "" : "s") + " recorded" +
      (kept < total ? "; " + kept + " kept in this file (the first, the latest and an even sample)." : ".");
  }

  function renderSummary(data) {
    const head = document.querySelector("#summary thead");
    const body = document.querySelector("#summary tbody");
    const columns = [
      ["role", "text"], ["method", "text"], ["calls"], ["mean run"], ["max run"], ["total run"],
      ["mean wait for inputs"], ["mean queued"], ["bytes in"], ["restarts"], ["failures"],
    ];
    const headRow = html("tr");
    for (const [name, cls] of columns) headRow.appendChild(html("th", { class: cls }, name));
    head.appendChild(headRow);
    const stats = data.stats || [];
    document.getElementById("summary-note").textContent = "Per role and method over all " + (data.dag_count || 0) +
      " steps, sorted by total run time (the top row is where the time goes).";
    if (!stats.length) {
      const row = html("tr");
      row.appendChild(html("td", { class: "text", colspan: columns.length }, "No calls recorded."));
      body.appendChild(row);
      return;
    }
    stats.forEach((s, i) => {
      const row = html("tr", { class: i === 0 && s.run_total > 0 ? "bottleneck" : null });
      const cells = [
        [s.role, "text"], [s.method, "text"], [s.count], [fmtDuration(s.run_mean)], [fmtDuration(s.run_max)],
        [fmtDuration(s.run_total)], [fmtDuration(s.input_wait_mean)], [fmtDuration(s.queue_wait_mean)],
        [fmtBytes(s.bytes_in)], [s.restarts, s.restarts ? "bad" : null], [s.failures, s.failures ? "bad" : null],
      ];
      for (const [value, cls] of cells) row.appendChild(html("td", { class: cls }, value));
      body.appendChild(row);
    });
  }

  function renderStep(data, position) {
    const dag = data.dags[position];
    const info = analyse(dag);
    const details = document.getElementById("node-details");
    const select = (id) => {
      for (const g of dagSvg.querySelectorAll(".node")) g.classList.toggle("selected", g.dataset.nodeId === String(id));
      clear(details);
      details.appendChild(html("pre", {}, describeNode(info, info.byId.get(id)).join("\n")));
    };
    drawDag(info, select);
    drawTimeline(info, document.getElementById("timeline"), select);
    clear(details);
    details.textContent = "Click a node or a bar for details.";

    const path = info.criticalOrder.map((n) => nodeName(n) + " " + fmtDuration(info.times.get(n.node_id).run));
    document.getElementById("step-summary").textContent = dag.label + " \u00b7 " + info.nodes.length + " node" +
      (info.nodes.length === 1 ? "" : "s") + " \u00b7 took " + fmtDuration(info.duration) +
      (typeof dag.finished === "number" ? "" : " (still running)") +
      (path.length ? " \u00b7 critical path: " + path.join(" \u2192 ") : "");

    const errors = document.getElementById("step-errors");
    clear(errors);
    for (const n of info.nodes.filter((m) => m.state === "failed")) {
      const box = html("div", { class: "failure" });
      box.appendChild(html("strong", {}, nodeName(n) + " failed" + (n.attempts > 1 ? " after " + n.attempts + " attempts" : "")));
      box.appendChild(html("pre", {}, n.error || "(no error message)"));
      errors.appendChild(box);
    }
  }

  function setupSteps(data) {
    const dags = data.dags || [];
    const select = document.getElementById("step-select");
    const prev = document.getElementById("prev");
    const next = document.getElementById("next");
    if (!dags.length) {
      document.getElementById("step-section").hidden = true;
      return;
    }
    const optionText = (dag) => (dag.label.includes(String(dag.index)) ? dag.label : dag.label + "  (#" + dag.index + ")");
    dags.forEach((dag, i) => select.appendChild(html("option", { value: i }, optionText(dag))));
    const show = (position) => {
      position = Math.min(Math.max(position, 0), dags.length - 1);
      select.value = String(position);
      prev.disabled = position === 0;
      next.disabled = position === dags.length - 1;
      try {
        renderStep(data, position);
        document.body.dataset.rendered = "ok";
      } catch (err) {
        fail(err);
      }
      try {
        history.replaceState(null, "", "#step=" + dags[position].index); // a link to this step
      } catch (err) {
        // some browsers refuse this for local files; the link is only a nicety
      }
    };
    select.addEventListener("change", () => show(Number(select.value)));
    prev.addEventListener("click", () => show(Number(select.value) - 1));
    next.addEventListener("click", () => show(Number(select.value) + 1));
    document.addEventListener("keydown", (event) => {
      if (event.target && event.target.tagName === "SELECT") return;
      if (event.key === "ArrowLeft") show(Number(select.value) - 1);
      if (event.key === "ArrowRight") show(Number(select.value) + 1);
    });
    // Open the step named in the address (#step=<index>), else the latest one.
    const wanted = /^#step=(\d+)$/.exec(window.location.hash);
    const position = wanted ? dags.findIndex((dag) => dag.index === Number(wanted[1])) : -1;
    show(position >= 0 ? position : dags.length - 1);
  }

  function fail(err) {
    const message = err && err.message ? err.message : String(err);
    document.body.dataset.rendered = "error: " + message;
    const box = document.getElementById("render-error");
    box.hidden = false;
    box.textContent = "Could not render the trace: " + message + (err && err.stack ? "\n" + err.stack : "");
  }

  try {
    const data = JSON.parse(document.getElementById("trace-data").textContent);
    renderHeader(data);
    renderSummary(data);
    setupSteps(data);
    if (!String(document.body.dataset.rendered).startsWith("error")) document.body.dataset.rendered = "ok";
  } catch (err) {
    fail(err);
  }
})();
