// rxcuda live view: the canvas pictures (the frame-time plot and a port's preview) and the number formats
// they share with app.js, which loads after this file. Pure drawing: each function draws what it is given.
"use strict";
window.rxcudaPlots = (() => {
  const MARK_COLOURS = {parameters: "rgba(120,120,120,0.25)", structure: "#8e44ad", code: "#16a085",
    recapture: "#c0392b", reload: "#d35400"};
  function fmtNum(v) {
    if (typeof v !== "number") return v === null || v === undefined ? "" : String(v);
    if (Number.isInteger(v)) return String(v);
    const s = String(v);
    return s.length > 10 ? String(Number(v.toPrecision(7))) : s;
  }
  const fmtUs = (us) => (us === null || us === undefined ? "-" : us >= 1000 ? (us / 1000).toFixed(2) + " ms"
    : us.toFixed(1) + " us");

  function fitCanvas(cv) {
    const r = window.devicePixelRatio || 1;
    const w = Math.max(100, Math.round(cv.clientWidth * r)), h = Math.max(60, Math.round(cv.clientHeight * r));
    if (cv.width !== w || cv.height !== h) { cv.width = w; cv.height = h; }
    const ctx = cv.getContext("2d");
    ctx.setTransform(r, 0, 0, r, 0, 0);
    return [ctx, w / r, h / r];
  }

  // the frame-time plot: frames [[index, host_us, gpu_us|null, ...], ...] and marks [[index, tier], ...]
  function drawPlot(canvas, F, marks) {
    const [ctx, W, H] = fitCanvas(canvas);
    ctx.clearRect(0, 0, W, H);
    const L = 46, R = 8, T = 10, B = 18;
    ctx.font = "10px system-ui, sans-serif";
    ctx.fillStyle = "#777";
    if (!F.length) { ctx.fillText("waiting for frames", L, H / 2); return; }
    const i0 = F[0][0], i1 = Math.max(F[F.length - 1][0], i0 + 1);
    let top = 1;
    for (const f of F) top = Math.max(top, f[1] || 0, f[2] || 0);
    top *= 1.15;
    const X = (i) => L + (W - L - R) * (i - i0) / (i1 - i0), Y = (v) => T + (H - T - B) * (1 - v / top);
    ctx.strokeStyle = "#eee";
    ctx.lineWidth = 1;
    for (let k = 0; k <= 4; k++) {
      const v = top * k / 4;
      ctx.beginPath(); ctx.moveTo(L, Y(v)); ctx.lineTo(W - R, Y(v)); ctx.stroke();
      ctx.fillText(fmtUs(v), 2, Y(v) + 3);
    }
    ctx.fillText("frame " + i0, L, H - 4);
    ctx.textAlign = "right";
    ctx.fillText(String(i1), W - R, H - 4);
    ctx.textAlign = "left";
    let labelled = -Infinity;
    for (const [i, what] of marks) {
      ctx.strokeStyle = MARK_COLOURS[what] || "#999";
      ctx.beginPath(); ctx.moveTo(X(i), T); ctx.lineTo(X(i), H - B); ctx.stroke();
      if (what !== "parameters" && X(i) - labelled > 50) {  // parameter updates are many: lines only
        ctx.fillStyle = ctx.strokeStyle;
        ctx.fillText(String(what), X(i) + 2, T + 8);
        labelled = X(i);
      }
    }
    const line = (col, idx) => {
      ctx.strokeStyle = col;
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      let pen = false;
      for (const f of F) {
        const v = f[idx];
        if (typeof v !== "number") { pen = false; continue; }
        if (pen) ctx.lineTo(X(f[0]), Y(v)); else ctx.moveTo(X(f[0]), Y(v));
        pen = true;
      }
      ctx.stroke();
    };
    const css = getComputedStyle(document.documentElement);
    line(css.getPropertyValue("--host").trim() || "#2f6fdb", 1);
    line(css.getPropertyValue("--gpu").trim() || "#e0742b", 2);
  }

  // a port's preview: `want` the port asked for ({block, port} or null), `m` its latest preview message
  function drawPreview(canvas, want, m) {
    const [ctx, W, H] = fitCanvas(canvas);
    ctx.clearRect(0, 0, W, H);
    ctx.font = "10px system-ui, sans-serif";
    ctx.fillStyle = "#777";
    if (!want) { ctx.fillText("select a block and an output port's line or hist", 8, H / 2); return; }
    if (!m) { ctx.fillText("waiting for samples of " + want.block + "." + want.port, 8, H / 2); return; }
    const L = 46, R = 8, T = 8, B = 16;
    const d = m.data;
    if (m.kind === "hist" && d && Array.isArray(d.counts)) {
      const counts = d.counts, edges = Array.isArray(d.edges) ? d.edges : [];
      const top = Math.max(1, ...counts);
      const w = (W - L - R) / Math.max(1, counts.length);
      ctx.fillStyle = "#5b7fd6";
      counts.forEach((n, i) => {
        const h = (H - T - B) * n / top;
        ctx.fillRect(L + i * w + 0.5, H - B - h, Math.max(1, w - 1), h);
      });
      ctx.fillStyle = "#777";
      ctx.fillText(String(top), 2, T + 8);  // the tallest bin's count; the element count is in the title
      ctx.fillText("0", 2, H - B);
      if (edges.length) {
        ctx.fillText(fmtNum(edges[0]), L, H - 3);
        ctx.textAlign = "right";
        ctx.fillText(fmtNum(edges[edges.length - 1]), W - R, H - 3);
        ctx.textAlign = "left";
      }
      return;
    }
    const v = Array.isArray(d) ? d : [];  // data[i] is element i * stride; null where it is NaN or infinite
    const finite = v.filter((x) => typeof x === "number");
    if (!finite.length) { ctx.fillText(v.length ? "no finite samples" : "no samples", 8, H / 2); return; }
    let lo = Math.min(...finite), hi = Math.max(...finite);
    if (lo === hi) { lo -= 1; hi += 1; }
    const X = (i) => L + (W - L - R) * i / Math.max(1, v.length - 1), Y = (x) => T + (H - T - B) * (hi - x) / (hi - lo);
    ctx.fillText(fmtNum(hi), 2, T + 8);
    ctx.fillText(fmtNum(lo), 2, H - B);
    const stride = typeof m.stride === "number" ? m.stride : 1;
    ctx.fillText(`element 0`, L, H - 3);
    ctx.textAlign = "right";
    ctx.fillText(`${(v.length - 1) * stride}`, W - R, H - 3);
    ctx.textAlign = "left";
    ctx.strokeStyle = "#5b7fd6";
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    let pen = false;
    v.forEach((x, i) => {
      if (typeof x !== "number") { pen = false; return; }
      if (pen) ctx.lineTo(X(i), Y(x)); else ctx.moveTo(X(i), Y(x));
      pen = true;
    });
    ctx.stroke();
  }

  return {fmtNum, fmtUs, drawPlot, drawPreview};
})();
