// rxcuda live view: plain JavaScript, no build step, no framework, no CDN. It speaks rxcuda/view/PROTOCOL.md
// (version 1) over one WebSocket at /ws. Nothing a message carries is ever parsed as HTML or code: text goes
// through textContent and attributes through setAttribute, so a block named "<img onerror=...>" stays a name.
"use strict";
(() => {
  const SVG = "http://www.w3.org/2000/svg";
  const FLOATS = new Set(["f16", "bf16", "f32", "f64"]);
  const BOX_W = 180, BOX_H = 60, PORT_GAP = 15, PORT_R = 4, FRAME_WINDOW = 300, KEEP_DIAGS = 300;
  const LABEL_CHAR = 6;      // px a character of a link label takes at most (11 px font)
  const MIN_SCALE = 0.75;   // the graph is never drawn smaller than this (its pane scrolls instead)
  const TOKEN = new URLSearchParams(location.search).get("token") || "";
  const $ = (id) => document.getElementById(id);
  const {fmtNum, fmtUs, drawPlot, drawPreview} = window.rxcudaPlots;  // static/plots.js

  const S = {
    ws: null, open: false, retry: 500, refused: false,
    blocks: new Map(),    // name -> the graph message's block entry
    values: new Map(),    // "block.param" -> the engine's value
    controls: new Map(),  // "block.param" -> control
    nodes: new Map(),     // name -> its SVG group
    selected: null,
    frames: [], marks: [], fps: null,
    badges: new Map(),    // block -> warnings and errors seen
    lastDiag: new Map(),  // block -> the latest of them
    diags: [],
    setId: 0,             // the id of the latest set sent (each set carries one; ack and error echo it)
    sets: new Map(),      // id -> the control key it set, until its ack or error comes back
    preview: null, previewData: null,
    plotDirty: false, previewDirty: false,
    devices: 1,           // the engine's device positions (the graph message's "devices")
    measured: true,       // false on a driver that runs nothing (hello's engine.measured): said where numbers are
  };

  // -- small DOM helpers ------------------------------------------------------------------------------
  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function sv(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  const clear = (e) => { while (e.firstChild) e.removeChild(e.firstChild); };
  const str = (v) => (v === null || v === undefined ? "" : String(v));
  function fmtBytes(n) {
    if (typeof n !== "number") return "-";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : String(n)) + " " + units[i];
  }
  const fmtShape = (s) => (Array.isArray(s) ? "[" + s.join("\u00d7") + "]" : str(s));
  const clip = (s, n) => (s.length > n ? s.slice(0, n - 1) + "\u2026" : s);

  // one pop-up at a time: a new message replaces the old one, the same one again counts up (no pile)
  function toast(message) {
    const box = $("toasts");
    let t = box.querySelector(".toast");
    if (!t) {
      t = el("div", {class: "toast", role: "alert"});
      t.addEventListener("click", () => t.remove());
      box.appendChild(t);
    }
    const again = t.dataset.message === message;
    t.dataset.message = message;
    t.dataset.times = again ? String(+t.dataset.times + 1) : "1";
    t.textContent = message + (again ? ` (\u00d7${t.dataset.times})` : "");
    clearTimeout(S.toastTimer);
    S.toastTimer = setTimeout(() => t.remove(), 7000);
  }

  // -- the connection -----------------------------------------------------------------------------------
  function send(msg) {
    if (!S.ws || S.ws.readyState !== WebSocket.OPEN) return false;
    S.ws.send(JSON.stringify(msg));
    return true;
  }
  function setConn(what) {
    const c = $("conn");
    c.dataset.state = what;
    c.textContent = what === "open" ? "live" : what === "closed" ? "disconnected, retrying" : what;
  }
  function connect() {
    const url = new URL("ws", location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    url.search = "";
    url.hash = "";
    const ws = new WebSocket(url.href);
    S.ws = ws;
    setConn("connecting");
    ws.onopen = () => send({type: "hello", token: TOKEN});
    ws.onmessage = (ev) => {
      let m;
      try { m = JSON.parse(ev.data); } catch (e) { return; }
      if (m && typeof m === "object") handle(m);
    };
    ws.onclose = (ev) => {
      if (S.ws !== ws) return;
      S.open = false;
      if (ev.code === 4403) {  // a wrong token: asking again changes nothing
        S.refused = true;
        setConn("refused (wrong token)");
        return;
      }
      setConn("closed");
      setTimeout(connect, S.retry);
      S.retry = Math.min(S.retry * 2, 5000);
    };
  }
  setInterval(() => { if (S.open) send({type: "ping"}); }, 15000);

  function handle(m) {
    switch (m.type) {
      case "hello": {
        S.open = true;
        S.retry = 500;
        setConn("open");
        const e = m.engine || {};
        $("device").textContent = str(e.device);
        $("profile").textContent = str(e.profile);
        $("frame").textContent = str(e.frame);
        S.measured = e.measured !== false;
        for (const id of ["plot-note", "preview-note"]) {  // the GPU times and the values: not measurements
          $(id).hidden = S.measured;
          $(id).textContent = S.measured ? "" : "not measured: " + str(e.unmeasured || "this driver runs nothing");
        }
        showBlockTimes();
        if (S.preview) send({type: "preview", block: S.preview.block, port: S.preview.port, kind: S.preview.kind});
        break;
      }
      case "graph": onGraph(m); break;
      case "frames": onFrames(m); break;
      case "params":
        for (const [key, v] of Object.entries(m.values || {})) {
          S.values.set(key, v);
          const c = S.controls.get(key);
          if (c) c.show(v);
        }
        break;
      case "diagnostic": onDiagnostic(m); break;
      case "status": onStatus(m); break;
      case "preview":
        if (S.preview && m.block === S.preview.block && m.port === S.preview.port) {
          S.previewData = m;
          S.previewDirty = true;
          $("preview-title").textContent = `${m.block}.${m.port} (${S.preview.kind})` +
            (typeof m.count === "number" ? ` \u00b7 ${m.count} elements` : "") +
            (typeof m.frame === "number" ? ` \u00b7 frame ${m.frame}` : "");
        }
        break;
      case "error": onError(str(m.message), m.id); break;
      case "ack": onAck(m.id); break;
      default: break;  // "pong", and kinds a later server may add
    }
  }

  // -- the graph ----------------------------------------------------------------------------------------
  function flatten(x, out) {
    if (Array.isArray(x)) for (const y of x) flatten(y, out);
    else if (typeof x === "string") out.push(x);
    return out;
  }

  function onGraph(g) {
    const blocks = Array.isArray(g.blocks) ? g.blocks : [];
    S.blocks = new Map(blocks.map((b) => [b.name, b]));
    S.devices = Math.max(1, Math.floor(+g.devices) || 1);  // over several devices each box says its device
    for (const b of blocks) for (const p of b.params || []) S.values.set(b.name + "." + p.name, p.value);
    if (S.selected !== null && !S.blocks.has(S.selected)) S.selected = null;
    // the server sends the graph again when only states changed (with diagnostics): then the picture and
    // the controls stay (a slider being dragged keeps its element) and only states, messages and values move
    const shape = JSON.stringify([blocks.map((b) => [b.name, b.kind, b.region, b.composite, b.ports, b.device]),
      g.links, g.layout, S.devices]);
    if (shape !== S.shape) {
      S.shape = shape;
      drawGraph(g, blocks);
    } else {
      for (const b of blocks) setBlockState(b.name, str(b.state), str(b.message));
    }
    const controls = JSON.stringify(blocks.map((b) => [b.name, (b.params || []).map((p) =>
      [p.name, p.dtype, p.min, p.max, p.step])]));
    if (controls !== S.controlShape) {
      S.controlShape = controls;
      buildParams(blocks);
    } else {
      for (const [key, c] of S.controls) c.show(S.values.get(key));
    }
    showSelected();
  }

  function drawGraph(g, blocks) {
    const svg = $("graph");
    clear(svg);
    S.nodes = new Map();
    const layout = g.layout || {};
    const byName = S.blocks;
    // a region with bodies is drawn as a group around them; its members, nested regions' members included
    const regionMembers = new Map();
    const membersOf = (r, seen) => {
      if (regionMembers.has(r.name)) return regionMembers.get(r.name);
      const out = new Set();
      for (const n of flatten(r.region && r.region.bodies, [])) {
        if (!byName.has(n) || seen.has(n)) continue;
        out.add(n);
        const inner = byName.get(n);
        if (inner.kind === "region") for (const k of membersOf(inner, new Set([...seen, n]))) out.add(k);
      }
      regionMembers.set(r.name, out);
      return out;
    };
    for (const b of blocks) if (b.kind === "region") membersOf(b, new Set([b.name]));
    const asGroup = (b) => b.kind === "region" && regionMembers.get(b.name).size > 0;

    const sides = (b) => ({left: (b.ports || []).filter((p) => p.direction !== "out"),
      right: (b.ports || []).filter((p) => p.direction !== "in")});
    const boxes = new Map();
    let spare = 0;
    const maxY = Math.max(0, ...Object.values(layout).map((p) => (Array.isArray(p) ? p[1] : 0)));
    // the server's columns (layers) keep their order; the gap between them fits the widest link label, so a
    // label stands between two boxes and not on their ports
    const links = Array.isArray(g.links) ? g.links : [];
    const widest = Math.max(0, ...links.map((l) => linkLabel(l, false).length * LABEL_CHAR));
    const gap = Math.max(60, Math.ceil(widest) + 2 * PORT_R + 10);
    const columns = [...new Set(Object.values(layout).filter(Array.isArray).map((p) => +p[0] || 0))]
      .sort((a, b) => a - b);
    const column = new Map(columns.map((x, i) => [x, (columns[0] || 0) + i * (BOX_W + gap)]));
    for (const b of blocks) {
      if (asGroup(b)) continue;
      const {left, right} = sides(b);
      const h = Math.max(BOX_H, 26 + PORT_GAP * Math.max(left.length, right.length) + (b.message ? 12 : 0));
      let at = layout[b.name];
      if (!Array.isArray(at)) at = [null, maxY + BOX_H + 60];  // no position: a row below
      const x = at[0] === null ? spare++ * (BOX_W + gap) : column.get(+at[0] || 0);
      boxes.set(b.name, {x, y: +at[1] || 0, w: BOX_W, h, left, right});
    }

    // groups: regions (around their bodies) and composites (around the blocks of an instance path)
    const groups = [];
    for (const b of blocks) {
      if (asGroup(b)) groups.push({name: b.name, block: b, members: regionMembers.get(b.name),
        label: b.name + " \u00b7 " + str(b.region.kind) + (deviceOf(b) ? " \u00b7 " + deviceOf(b) : ""),
        cls: "group region"});
    }
    const comps = new Map();
    for (const b of blocks) {
      if (!b.composite) continue;
      const parts = String(b.composite).split("/");
      for (let i = 1; i <= parts.length; i++) {
        const path = parts.slice(0, i).join("/");
        if (!comps.has(path)) comps.set(path, new Set());
        comps.get(path).add(b.name);
        if (regionMembers.has(b.name)) for (const k of regionMembers.get(b.name)) comps.get(path).add(k);
      }
    }
    for (const [path, members] of comps) {
      groups.push({name: path, members, label: path, cls: "group composite", depth: path.split("/").length});
    }
    // inner groups first (fewer members; on a tie a region, then the deeper composite path), so that each
    // outer group is drawn around the inner ones it contains
    groups.sort((a, b) => a.members.size - b.members.size || (b.depth || 1e9) - (a.depth || 1e9));
    const done = [];
    for (const gr of groups) {
      let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
      const take = (r) => { x0 = Math.min(x0, r.x); y0 = Math.min(y0, r.y); x1 = Math.max(x1, r.x + r.w);
        y1 = Math.max(y1, r.y + r.h); };
      for (const n of gr.members) if (boxes.has(n)) take(boxes.get(n));
      for (const inner of done) if ([...inner.members].every((n) => gr.members.has(n))) take(inner.box);
      if (x0 === Infinity) continue;
      gr.box = {x: x0 - 12, y: y0 - 26, w: x1 - x0 + 24, h: y1 - y0 + 38};
      done.push(gr);
      if (gr.block) boxes.set(gr.name, Object.assign({}, gr.box, sides(gr.block)));
    }

    const gGroups = sv("g", {id: "groups"}), gLinks = sv("g", {id: "links"}), gBlocks = sv("g", {id: "blocks"});
    svg.append(gGroups, gLinks, gBlocks);
    for (const gr of done.slice().reverse()) {
      const attrs = {class: gr.cls, transform: `translate(${gr.box.x},${gr.box.y})`};
      if (gr.block) Object.assign(attrs, {"data-block": gr.name, "data-state": str(gr.block.state), tabindex: 0});
      else attrs["data-composite"] = gr.name;
      const e = sv("g", attrs);
      e.append(sv("rect", {width: gr.box.w, height: gr.box.h}), sv("text", {x: 10, y: 16}, gr.label));
      if (gr.block) {
        e.appendChild(sv("title", {}, tooltip(gr.block)));
        hookSelect(e, gr.name);
        S.nodes.set(gr.name, e);
      }
      gGroups.appendChild(e);
    }

    const extent = [];  // what links add to the picture
    const portAt = (name, port, out) => {
      const b = boxes.get(name);
      if (!b) return null;
      const list = out ? b.right : b.left;
      const i = Math.max(0, list.findIndex((p) => p.name === port));
      return [out ? b.x + b.w : b.x, b.y + 30 + i * PORT_GAP];
    };
    // a link that goes back to the left (feedback through a delay) runs below every box
    let floor = -Infinity;
    for (const r of [...boxes.values(), ...done.map((d) => d.box)]) floor = Math.max(floor, r.y + r.h);
    const lanes = {n: 0};
    for (const l of links) {
      const s = portAt(l.src[0], l.src[1], true), t = portAt(l.dst[0], l.dst[1], false);
      if (!s || !t) continue;
      let d, mid;
      if (t[0] >= s[0] + 20) {
        const dx = Math.max(40, (t[0] - s[0]) / 2);
        const c1 = [s[0] + dx, s[1]], c2 = [t[0] - dx, t[1]];
        d = `M${s} C${c1} ${c2} ${t}`;
        mid = [(s[0] + 3 * c1[0] + 3 * c2[0] + t[0]) / 8, (s[1] + 3 * c1[1] + 3 * c2[1] + t[1]) / 8];
      } else {
        const y = floor + 30 + 22 * lanes.n++;
        d = `M${s} C${s[0] + 50},${s[1]} ${s[0] + 50},${y} ${s[0]},${y} L${t[0]},${y} ` +
          `C${t[0] - 50},${y} ${t[0] - 50},${t[1]} ${t}`;
        mid = [(s[0] + t[0]) / 2, y];
        extent.push({x: t[0] - 50, y: y, w: s[0] - t[0] + 100, h: 8});
      }
      const delayed = (l.delay || 0) > 0;
      const key = `${l.src[0]}.${l.src[1]}->${l.dst[0]}.${l.dst[1]}`;
      const e = sv("g", {class: delayed ? "link delayed" : "link", "data-link": key});
      e.append(sv("path", {d}),
        sv("text", {x: mid[0], y: mid[1] - 7, "text-anchor": "middle"}, linkLabel(l)),
        sv("title", {}, key + (l.bytes ? ` (${fmtBytes(l.bytes)})` : "")));
      gLinks.appendChild(e);
    }

    for (const b of blocks) {
      if (asGroup(b)) continue;
      const box = boxes.get(b.name);
      const e = sv("g", {class: "block", "data-block": b.name, "data-state": str(b.state),
        transform: `translate(${box.x},${box.y})`, tabindex: 0});
      e.append(sv("rect", {class: "box", width: box.w, height: box.h}),
        sv("text", {class: "name", x: 8, y: 16}, clip(b.name, 17)),
        sv("text", {class: "gpu", x: box.w - 8, y: 16, "text-anchor": "end"}, ""));
      box.left.forEach((p, i) => e.append(sv("circle", {class: "port", cx: 0, cy: 30 + i * PORT_GAP, r: PORT_R}),
        sv("text", {class: "port-label", x: 7, y: 33 + i * PORT_GAP}, clip(p.name, 12))));
      box.right.forEach((p, i) => e.append(sv("circle", {class: "port", cx: box.w, cy: 30 + i * PORT_GAP, r: PORT_R}),
        sv("text", {class: "port-label", x: box.w - 7, y: 33 + i * PORT_GAP, "text-anchor": "end"},
          clip(p.name, 12))));
      const dev = deviceOf(b);  // several devices: the block's own, at the box's bottom right
      e.appendChild(sv("text", {class: "msg", x: 8, y: box.h - 6}, clip(str(b.message), dev ? 17 : 27)));
      if (dev) e.appendChild(sv("text", {class: "device", x: box.w - 8, y: box.h - 6, "text-anchor": "end"}, dev));
      const badge = sv("g", {class: "badges", transform: `translate(${box.w - 2},0)`, visibility: "hidden"});
      badge.append(sv("circle", {class: "badge", r: 9}),
        sv("text", {class: "badge-text", "text-anchor": "middle", y: 3.5}, ""), sv("title", {}, ""));
      e.append(badge, sv("title", {}, tooltip(b)));
      hookSelect(e, b.name);
      S.nodes.set(b.name, e);
      gBlocks.appendChild(e);
      updateBadge(b.name);
    }

    // the picture's extent: every box and group, and the server's own bounds
    let x0 = 0, y0 = 0, x1 = +g.width || 0, y1 = +g.height || 0;
    for (const r of [...boxes.values(), ...done.map((d) => d.box), ...extent]) {
      x0 = Math.min(x0, r.x); y0 = Math.min(y0, r.y); x1 = Math.max(x1, r.x + r.w); y1 = Math.max(y1, r.y + r.h);
    }
    const vw = Math.max(200, x1 - x0 + 60), vh = Math.max(120, y1 - y0 + 60);
    svg.setAttribute("viewBox", `${x0 - 30} ${y0 - 30} ${vw} ${vh}`);
    // never drawn smaller than MIN_SCALE (text stays readable on a small screen): the pane scrolls instead
    svg.style.minWidth = `${Math.round(vw * MIN_SCALE)}px`;
    markSelected();
    showBlockTimes();
  }

  function linkLabel(l, withDelay = true) {  // a delayed link's label mostly runs along its own lane
    return `${str(l.dtype)} ${fmtShape(l.shape)}` + (withDelay && (l.delay || 0) > 0 ? ` \u00b7 delay ${l.delay}` : "");
  }

  function deviceOf(b) {  // "device N" on an engine over several devices, else ""
    return S.devices > 1 ? "device " + (Math.floor(+b.device) || 0) : "";
  }

  function tooltip(b) {
    const lines = [b.name + (b.kind === "region" && b.region ? ` (${str(b.region.kind)} region)` : ""),
      "state: " + str(b.state)];
    if (b.message) lines.push(str(b.message));
    if (b.composite) lines.push("in " + b.composite);
    if (deviceOf(b)) lines.push("on " + deviceOf(b));
    return lines.join("\n");
  }

  function hookSelect(e, name) {
    e.addEventListener("click", (ev) => { ev.stopPropagation(); select(name); });
    e.addEventListener("keydown", (ev) => { if (ev.key === "Enter") select(name); });
  }

  function setBlockState(name, state, message) {
    const b = S.blocks.get(name);
    if (!b) return;
    b.state = state;
    b.message = message;
    const e = S.nodes.get(name);
    if (e && e.getAttribute("data-state") === state && e.dataset.message === message) return;
    if (e) e.dataset.message = message;
    if (e) {
      e.setAttribute("data-state", state);
      const msg = e.querySelector("text.msg");
      if (msg) msg.textContent = clip(str(message), 27);
      const t = e.querySelector(":scope > title");
      if (t) t.textContent = tooltip(b);
    }
    if (S.selected === name) showSelected();
  }

  function updateBadge(name) {
    const e = S.nodes.get(name);
    const n = S.badges.get(name) || 0;
    if (!e) return;
    const g = e.querySelector("g.badges");
    if (!g) return;
    g.setAttribute("visibility", n ? "visible" : "hidden");
    g.querySelector("text").textContent = n > 99 ? "99+" : String(n);
    g.querySelector("title").textContent = `${n} diagnostic(s); the latest: ${S.lastDiag.get(name) || ""}`;
    e.setAttribute("data-diagnostics", String(n));
  }

  function showBlockTimes() {
    const times = S.blockTimes || {};
    for (const [name, e] of S.nodes) {
      const t = e.querySelector("text.gpu");
      if (t) t.textContent = name in times ? (S.measured ? fmtUs(times[name]) : "not measured") : "";
    }
  }

  // -- selection and the side panel --------------------------------------------------------------------
  function select(name) {
    S.selected = name;
    markSelected();
    showSelected();
    const e = name === null ? null : S.nodes.get(name);  // chosen from a list: bring it into the graph's view
    if (e && e.scrollIntoView) e.scrollIntoView({block: "nearest", inline: "nearest"});
  }
  function markSelected() {
    for (const [name, e] of S.nodes) e.classList.toggle("selected", name === S.selected);
    const all = $("all-params").checked || S.selected === null;
    for (const fs of $("params").children) {
      const mine = fs.dataset.blockParams === S.selected;
      fs.hidden = !(all || mine);
      fs.classList.toggle("selected", mine);
    }
  }
  $("all-params").addEventListener("change", markSelected);
  $("graph").addEventListener("click", () => select(null));

  function showSelected() {
    const b = S.selected === null ? null : S.blocks.get(S.selected);
    const title = $("block-title"), st = $("block-state"), ports = $("block-ports"), list = $("block-diagnostics");
    clear(ports);
    clear(list);
    if (!b) {
      title.textContent = "no block selected";
      st.textContent = "click a block in the graph";
      st.removeAttribute("data-state");
      $("block-message").textContent = "";
      return;
    }
    title.textContent = b.name + (b.kind === "region" && b.region ? ` (${str(b.region.kind)} region)` : "");
    st.textContent = "state: " + str(b.state) + (b.composite ? ` \u00b7 in ${b.composite}` : "") +
      (deviceOf(b) ? ` \u00b7 on ${deviceOf(b)}` : "") +
      (S.blockTimes && b.name in S.blockTimes ? ` \u00b7 GPU ${fmtUs(S.blockTimes[b.name])}` +
        (S.measured ? "" : " (not measured)") : "");
    st.dataset.state = str(b.state);
    $("block-message").textContent = str(b.message);
    for (const p of b.ports || []) {
      const row = el("div", {class: "port-row", "data-port": b.name + "." + p.name});
      row.appendChild(el("span", {}, `${p.direction} ${p.name}: ${str(p.dtype)} ${fmtShape(p.shape)}`));
      if (p.direction !== "in") {
        for (const kind of ["line", "hist"]) {
          const btn = el("button", {type: "button", "data-preview": `${b.name}.${p.name}:${kind}`}, kind);
          btn.addEventListener("click", () => startPreview(b.name, p.name, kind));
          row.appendChild(btn);
        }
      }
      ports.appendChild(row);
    }
    for (const d of S.diags.filter((x) => x.block === b.name).slice(-30).reverse()) list.appendChild(diagItem(d));
  }

  // -- parameter controls -------------------------------------------------------------------------------
  function buildParams(blocks) {
    const box = $("params");
    const focused = document.activeElement && document.activeElement.dataset
      ? document.activeElement.dataset.param : undefined;
    clear(box);
    S.controls = new Map();
    for (const b of blocks) {
      if (!b.params || !b.params.length) continue;
      const fs = el("fieldset", {"data-block-params": b.name});
      fs.appendChild(el("legend", {}, b.name));
      for (const p of b.params) fs.appendChild(makeControl(b.name, p));
      box.appendChild(fs);
    }
    if (focused && S.controls.has(focused)) S.controls.get(focused).num.focus();
    markSelected();
  }

  function makeControl(blockName, p) {
    const key = blockName + "." + p.name;
    const dtype = str(p.dtype);
    const isFloat = FLOATS.has(dtype), isBool = dtype === "bool";
    const num = (x) => (typeof x === "number" && Number.isFinite(x) ? x : null);
    const c = {key, block: blockName, param: p.name, dtype, min: num(p.min), max: num(p.max), step: num(p.step),
      dirty: false, dragging: false, timer: null, pending: undefined};
    const wrap = el("div", {class: "param", "data-param-row": key});
    c.wrap = wrap;
    const label = el("label", {});
    label.append(el("span", {}, p.name), el("span", {class: "small"}, dtype));
    wrap.appendChild(label);
    const row = el("div", {class: "row"});
    wrap.appendChild(row);
    c.refusedEl = el("div", {class: "refused", "data-refused": key, role: "status"});
    c.note = el("div", {class: "range-note"});

    if (isBool) {
      c.box = el("input", {type: "checkbox", "data-param": key});
      c.box.addEventListener("change", () => sendSet(c, c.box.checked));
      row.appendChild(c.box);
      c.show = (v) => { c.box.checked = !!v; };
    } else {
      c.num = el("input", {type: "text", class: "num", inputmode: isFloat ? "decimal" : "numeric",
        "data-param": key, "aria-label": key, spellcheck: "false", autocomplete: "off"});
      const slider = isFloat || (c.min !== null && c.max !== null);
      if (slider) {
        c.range = el("input", {type: "range", "data-slider": key, "aria-label": key + " slider"});
        row.appendChild(c.range);
        c.range.addEventListener("pointerdown", () => { c.dragging = true; });
        c.range.addEventListener("input", () => {
          const v = Number(c.range.value);
          c.num.value = fmtNum(v);
          clearRefusal(c);
          throttled(c, v);
        });
        c.range.addEventListener("change", () => {
          c.dragging = false;
          flush(c, Number(c.range.value));
        });
      }
      row.appendChild(c.num);
      c.num.addEventListener("input", () => { c.dirty = true; clearRefusal(c); });
      c.num.addEventListener("keydown", (ev) => {
        if (ev.key === "Enter") commit(c);
        else if (ev.key === "Escape") { c.dirty = false; c.show(S.values.get(key)); }
      });
      c.num.addEventListener("blur", () => { if (c.dirty) commit(c); });
      if (isFloat && (c.min === null || c.max === null)) {
        const widen = el("button", {type: "button", "data-widen": key, title: "widen the slider's span"}, "widen");
        widen.addEventListener("click", () => { span(c, 2); c.show(S.values.get(key)); });
        row.appendChild(widen);
      }
      c.show = (v) => {
        if (typeof v !== "number") return;
        if (c.range) {
          if (c.lo === undefined) span(c, 0, v);
          if (v < c.lo || v > c.hi) span(c, 0, v);  // a value from elsewhere beyond the span widens it
          if (!c.dragging) c.range.value = String(v);
        }
        if (!(c.dirty && document.activeElement === c.num)) c.num.value = fmtNum(v);
      };
    }
    wrap.append(c.note, c.refusedEl);
    S.controls.set(key, c);
    c.show(S.values.has(key) ? S.values.get(key) : p.value);
    return wrap;
  }

  // the slider's range: declared min/max where given; else a span around the value that `factor` widens
  function span(c, factor, around) {
    const v = typeof around === "number" ? around : Number(c.range.value);
    let lo, hi;
    if (factor && c.lo !== undefined) {
      const half = (c.hi - c.lo) * factor / 2;
      lo = v - half;
      hi = v + half;
    } else {
      const half = Math.max(Math.abs(v), c.dtype.startsWith("f") || c.dtype === "bf16" ? 1 : 10);
      lo = v - half;
      hi = v + half;
      if (c.lo !== undefined) { lo = Math.min(lo, c.lo); hi = Math.max(hi, c.hi); }
    }
    if (c.min !== null) lo = c.min;
    if (c.max !== null) hi = c.max;
    if (c.min === null && c.max !== null && lo >= hi) lo = hi - Math.max(1, Math.abs(hi));
    if (c.max === null && c.min !== null && hi <= lo) hi = lo + Math.max(1, Math.abs(lo));
    c.lo = lo;
    c.hi = hi;
    c.range.min = String(lo);
    c.range.max = String(hi);
    c.range.step = c.step !== null ? String(c.step) : FLOATS.has(c.dtype) ? "any" : "1";
    const declared = c.min !== null && c.max !== null ? "declared range" : "span";
    c.note.textContent = `${declared} [${fmtNum(lo)}, ${fmtNum(hi)}]` + (c.step !== null ? ` step ${fmtNum(c.step)}` : "");
  }

  function throttled(c, v) {  // at most one set per 40 ms while a slider moves; the last value always goes
    c.pending = v;
    if (c.timer) return;
    sendSet(c, v);
    c.pending = undefined;
    c.timer = setTimeout(() => {
      c.timer = null;
      if (c.pending !== undefined) throttled(c, c.pending);
    }, 40);
  }
  function flush(c, v) {
    if (c.timer) { clearTimeout(c.timer); c.timer = null; }
    c.pending = undefined;
    sendSet(c, v);
  }

  function commit(c) {
    c.dirty = false;
    const text = c.num.value.trim();
    const v = text === "" ? NaN : Number(text);
    if (!Number.isFinite(v)) {  // JSON has no NaN or infinity: refused here, and nothing is sent
      refuse(c, `${c.key}: '${clip(text, 40)}' is not a number`);
      c.show(S.values.get(c.key));
      return;
    }
    sendSet(c, v);
  }

  function sendSet(c, value) {
    const id = ++S.setId;
    if (!send({type: "set", block: c.block, param: c.param, value, id})) {
      refuse(c, "not connected: the value was not sent");
      c.show(S.values.get(c.key));
      return;
    }
    c.lastId = id;
    S.sets.set(id, c.key);
    if (S.sets.size > 500) S.sets.delete(S.sets.keys().next().value);  // answers lost with a closed socket
  }

  function refuse(c, message) {
    c.refusedEl.textContent = message;
    c.wrap.classList.add("refused-now");
  }
  function clearRefusal(c) {
    c.refusedEl.textContent = "";
    c.wrap.classList.remove("refused-now");
  }

  // a refused set: its error shows once, under its control (found by the set's id, or else by the control
  // the message names), and the control goes back to the engine's value; any other error is a pop-up
  function onError(message, id) {
    let c = null;
    if (S.sets.has(id)) {
      c = S.controls.get(S.sets.get(id)) || null;
      S.sets.delete(id);
      if (c && c.lastId !== id) return;  // a later value of that control is on its way: its answer counts
    } else {
      for (const [key, ctl] of S.controls) if (message.includes(key) && (!c || key.length > c.key.length)) c = ctl;
    }
    if (!c) { toast(message); return; }
    refuse(c, message);
    c.dirty = false;
    c.show(S.values.get(c.key));
  }
  // an accepted set: an old refusal under its control goes
  function onAck(id) {
    const key = S.sets.get(id);
    S.sets.delete(id);
    const c = key === undefined ? null : S.controls.get(key);
    if (c && c.lastId === id) clearRefusal(c);
  }

  // -- frames and the frame-time plot -------------------------------------------------------------------
  function onFrames(m) {
    for (const f of Array.isArray(m.frames) ? m.frames : []) S.frames.push(f);
    if (S.frames.length > FRAME_WINDOW) S.frames.splice(0, S.frames.length - FRAME_WINDOW);
    for (const mk of Array.isArray(m.marks) ? m.marks : []) S.marks.push(mk);
    const first = S.frames.length ? S.frames[0][0] : 0;
    S.marks = S.marks.filter((mk) => mk[0] >= first).slice(-FRAME_WINDOW);
    if (S.frames.length) $("frame").textContent = String(S.frames[S.frames.length - 1][0]);
    if (typeof m.fps === "number") $("fps").textContent = m.fps.toFixed(1);
    if (m.blocks && typeof m.blocks === "object") {
      S.blockTimes = m.blocks;
      showBlockTimes();
    }
    S.plotDirty = true;
  }

  // -- diagnostics --------------------------------------------------------------------------------------
  function diagItem(d) {
    const li = el("li", {"data-severity": str(d.severity), "data-diag-block": d.block || null});
    const where = (d.frame !== undefined && d.frame !== null ? `#${d.frame} ` : "") + str(d.severity) +
      " \u00b7 " + (d.block ? d.block : str(d.subject));
    li.append(el("span", {class: "where"}, where), el("span", {class: "text"}, str(d.message)));
    if (d.block) li.addEventListener("click", () => select(d.block));
    return li;
  }

  function onDiagnostic(d) {
    S.diags.push(d);
    if (S.diags.length > KEEP_DIAGS) S.diags.splice(0, S.diags.length - KEEP_DIAGS);
    const list = $("diagnostics");
    list.insertBefore(diagItem(d), list.firstChild);
    while (list.children.length > KEEP_DIAGS) list.removeChild(list.lastChild);
    if (!d.block) return;
    if (d.severity === "warning" || d.severity === "error") {
      S.badges.set(d.block, (S.badges.get(d.block) || 0) + 1);
      S.lastDiag.set(d.block, `${str(d.severity)}: ${str(d.message)}`);
      updateBadge(d.block);
    }
    // a block's state comes with the graph; a diagnostic that carries the state it left (an optional
    // "state" field) updates it at once
    if (S.blocks.has(d.block) && typeof d.state === "string") setBlockState(d.block, d.state, str(d.message));
    else if (S.selected === d.block) showSelected();
  }

  // -- status -------------------------------------------------------------------------------------------
  function table(head, rows) {
    const t = el("table");
    const tr = el("tr");
    for (const h of head) tr.appendChild(el("th", {}, h));
    t.appendChild(tr);
    for (const r of rows) {
      const row = el("tr", r.attrs || {});
      for (const cell of r.cells) row.appendChild(el("td", {}, cell));
      t.appendChild(row);
    }
    return t;
  }

  function onStatus(m) {
    // null: a figure the engine cannot measure (an isolated engine's GPU process does not report it)
    const figure = (v, fmt) => (v === null ? "not measured" : fmt(v));
    if (m.rebuilds !== undefined) $("rebuilds").textContent = figure(m.rebuilds, str);
    const box = $("status");
    clear(box);
    const mem = m.memory || {};
    box.appendChild(el("div", {id: "memory-total"}, `rebuilds ${figure(m.rebuilds, str)} \u00b7 reserved ` +
      figure(mem.bytes_reserved, fmtBytes)));
    if (Array.isArray(m.unmeasured) && m.unmeasured.length) {
      box.appendChild(el("p", {id: "status-unmeasured", class: "unmeasured"},
        "not measured: " + m.unmeasured.map(str).join(", ")));
    }
    const classes = Array.isArray(mem.by_class) ? mem.by_class : [];
    if (classes.length) {
      box.appendChild(table(["pool class", "in use", "free"],
        classes.map(([size, used, free]) => ({attrs: {"data-class": str(size)},
          cells: [fmtBytes(size), str(used), str(free)]}))));
    }
    const appends = Object.entries(m.appends || {});
    if (appends.length) {
      box.appendChild(table(["append port", "count", "capacity", ""], appends.map(([port, a]) => ({
        attrs: {"data-append": port, class: a.overflowed ? "overflowed" : null},
        cells: [port, str(a.count), str(a.capacity), a.overflowed ? "overflowed" : ""]}))));
    }
    if (m.stats) box.appendChild(el("pre", {id: "stats"}, str(m.stats)));
  }

  // -- port preview -------------------------------------------------------------------------------------
  function startPreview(block, port, kind) {
    const old = S.preview;
    if (old && (old.block !== block || old.port !== port)) send({type: "unpreview", block: old.block, port: old.port});
    S.preview = {block, port, kind};
    S.previewData = null;
    S.previewDirty = true;
    send({type: "preview", block, port, kind});
    $("preview-title").textContent = `${block}.${port} (${kind})`;
    $("preview-stop").hidden = false;
  }
  $("preview-stop").addEventListener("click", () => {
    if (S.preview) send({type: "unpreview", block: S.preview.block, port: S.preview.port});
    S.preview = null;
    S.previewData = null;
    S.previewDirty = true;
    $("preview-title").textContent = "";
    $("preview-stop").hidden = true;
  });

  function paint() {
    if (S.plotDirty) { S.plotDirty = false; drawPlot($("plot"), S.frames, S.marks); }
    if (S.previewDirty) { S.previewDirty = false; drawPreview($("preview"), S.preview, S.previewData); }
    requestAnimationFrame(paint);
  }
  window.addEventListener("resize", () => { S.plotDirty = true; S.previewDirty = true; });

  S.plotDirty = true;
  S.previewDirty = true;
  requestAnimationFrame(paint);
  connect();
})();
