/* ropelens band mixer: the attention a head would have from chosen bands and planes alone.
 *
 * Every number drawn is recomputed here from the post-RoPE q and k the page holds: the logit of
 * query i and key j is score_scale * sum over the chosen head dims of q[i, d] k[j, d], then the
 * layer's soft-cap, its mask (causal, sliding window, chunk, or the mask it was captured with) and
 * its softmax with the head's sink logit, if any. No server, no network. */
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("ropelens-data").textContent);
  const N = DATA.tokens.length;
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
    "#17becf", "#bcbd22", "#7f7f7f"];

  // ------------------------------------------------------------------------ decoding (on demand)
  function bytesOf(b64) {
    const bin = atob(b64);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  function halfToFloat(h) {
    const sign = h & 0x8000 ? -1 : 1;
    const e = (h >> 10) & 0x1f;
    const f = h & 0x3ff;
    if (e === 0) return sign * f * Math.pow(2, -24);
    if (e === 31) return f ? NaN : sign * Infinity;
    return sign * (1 + f / 1024) * Math.pow(2, e - 15);
  }
  function decodeFloats(stored, d) { // [head, pos, d] values, row-major
    const b = bytesOf(stored.data);
    const view = new DataView(b.buffer);
    if (stored.dtype === "float16") {
      const out = new Float64Array(b.length / 2);
      for (let i = 0; i < out.length; i++) out[i] = halfToFloat(view.getUint16(2 * i, true));
      return out;
    }
    if (stored.dtype === "int16") { // integers times a float32 scale per head and head dim
      const sb = bytesOf(stored.scale);
      const sv = new DataView(sb.buffer);
      const scale = new Float64Array(sb.length / 4);
      for (let i = 0; i < scale.length; i++) scale[i] = sv.getFloat32(4 * i, true);
      const out = new Float64Array(b.length / 2);
      for (let i = 0; i < out.length; i++) {
        const h = Math.floor(i / (N * d));
        out[i] = view.getInt16(2 * i, true) * scale[h * d + (i % d)];
      }
      return out;
    }
    const out = new Float64Array(b.length / 4);
    for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
    return out;
  }
  function maskOf(L) {
    const m = new Uint8Array(N * N);
    if (L.mask) {
      const bits = bytesOf(L.mask);
      for (let t = 0; t < N * N; t++) m[t] = (bits[t >> 3] >> (7 - (t & 7))) & 1;
      return m;
    }
    for (let i = 0; i < N; i++) {
      for (let j = 0; j <= i; j++) {
        let ok = true;
        if (L.window && i - j >= L.window) ok = false;
        if (L.chunk && Math.floor(i / L.chunk) !== Math.floor(j / L.chunk)) ok = false;
        m[i * N + j] = ok ? 1 : 0;
      }
    }
    return m;
  }
  const decoded = new Map(); // layer index -> {q, k, mask}; the two most recent kept
  function arrays(li) {
    if (!decoded.has(li)) {
      const L = DATA.layers[li];
      decoded.set(li, { q: decodeFloats(L.q, L.d_head), k: decodeFloats(L.k, L.d_head), mask: maskOf(L) });
      while (decoded.size > 2) decoded.delete(decoded.keys().next().value);
    }
    return decoded.get(li);
  }

  // ------------------------------------------------------------------------------- the pattern
  function pattern(li, h, dims) {
    const L = DATA.layers[li];
    const A = arrays(li);
    const d = L.d_head;
    const kv = Math.floor(h / (L.n_heads / L.n_kv_heads));
    const qo = h * N * d;
    const ko = kv * N * d;
    const cap = L.softcap;
    const sink = L.sinks ? L.sinks[h] : null;
    const out = new Float64Array(N * N);
    const s = new Float64Array(N);
    for (let i = 0; i < N; i++) {
      let max = sink === null ? -Infinity : sink;
      let any = false;
      for (let j = 0; j < N; j++) {
        if (!A.mask[i * N + j]) continue;
        let x = 0;
        const qi = qo + i * d;
        const kj = ko + j * d;
        for (let t = 0; t < dims.length; t++) x += A.q[qi + dims[t]] * A.k[kj + dims[t]];
        x *= L.score_scale;
        if (cap) x = cap * Math.tanh(x / cap);
        s[j] = x;
        any = true;
        if (x > max) max = x;
      }
      if (!any) continue;
      let sum = sink === null ? 0 : Math.exp(sink - max);
      for (let j = 0; j < N; j++) if (A.mask[i * N + j]) sum += (s[j] = Math.exp(s[j] - max));
      for (let j = 0; j < N; j++) if (A.mask[i * N + j]) out[i * N + j] = s[j] / sum;
    }
    return out;
  }
  function argmaxRows(p) {
    const top = new Int32Array(N);
    for (let i = 0; i < N; i++) {
      let best = 0;
      for (let j = 1; j < N; j++) if (p[i * N + j] > p[i * N + best]) best = j;
      top[i] = best;
    }
    return top;
  }

  // ------------------------------------------------------------------------------------- state
  const opening = DATA.open || {};
  const S = { li: Math.max(0, DATA.layers.findIndex((x) => x.layer === opening.layer)),
    head: opening.head || 0, planes: new Set(), extras: new Set(), row: N - 1, pinned: false,
    drawn: null, full: null, alone: [], fullTop: null };
  const layer = () => DATA.layers[S.li];
  function bandDims(L, b) {
    const band = L.bands[b];
    const dims = band.extra.slice();
    for (const p of band.planes) dims.push(L.plane_dims[p][0], L.plane_dims[p][1]);
    return dims;
  }
  function chosenDims() {
    const L = layer();
    const dims = [];
    for (const p of S.planes) dims.push(L.plane_dims[p][0], L.plane_dims[p][1]);
    for (const b of S.extras) dims.push(...L.bands[b].extra);
    return Int32Array.from(dims.sort((a, b) => a - b));
  }
  function bandState(b) { // "on", "off", "partial", or "empty"
    const band = layer().bands[b];
    const parts = band.planes.map((p) => S.planes.has(p));
    if (band.extra.length) parts.push(S.extras.has(b));
    if (!parts.length) return "empty";
    const n = parts.filter(Boolean).length;
    return n === parts.length ? "on" : n === 0 ? "off" : "partial";
  }
  function bandIndex(name) {
    const names = layer().bands.map((b) => b.name);
    if (typeof name === "number" && name >= 0 && name < names.length) return name;
    const exact = names.indexOf(name);
    if (exact >= 0) return exact;
    const short = names.map((n, i) => [n.split(" ")[0], i]).filter(([n]) => n === name);
    if (short.length === 1) return short[0][1];
    throw new Error("band " + JSON.stringify(name) + " is not a band of layer " + layer().layer +
      ": choose from " + JSON.stringify(names));
  }
  function select(bands, planes) {
    const L = layer();
    S.planes = new Set();
    S.extras = new Set();
    for (const name of bands || []) {
      const b = bandIndex(name);
      L.bands[b].planes.forEach((p) => S.planes.add(p));
      if (L.bands[b].extra.length) S.extras.add(b);
    }
    for (const p of planes || []) {
      if (!Number.isInteger(p) || p < 0 || p >= L.plane_dims.length) {
        throw new Error("plane " + p + " is not a plane of layer " + L.layer + ": it has planes 0.." +
          (L.plane_dims.length - 1));
      }
      S.planes.add(p);
    }
  }
  function selectAll() {
    select(layer().bands.map((b) => b.name), []);
  }

  // --------------------------------------------------------------------------------- the page
  const el = (tag, attrs, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") e.textContent = v; else e.setAttribute(k, v);
    }
    kids.forEach((c) => e.appendChild(c));
    return e;
  };
  function tokenLabel(i, width) {
    let t = DATA.tokens[i].replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5");
    if (width && t.length > width) t = t.slice(0, width - 1) + "\u2026";
    return t;
  }
  const quoted = (i) => i + " \u201c" + tokenLabel(i, 24) + "\u201d";
  function fmtWave(w) { // tokens per turn, short enough for two plane columns
    if (w === null) return "\u221e";
    if (w < 100) return w.toFixed(1);
    if (w < 1e4) return String(Math.round(w));
    if (w < 1e6) return Math.round(w / 1e3) + "k";
    return (w / 1e6).toPrecision(2) + "M";
  }
  function headLabel(L, h) { return "head " + h + (L.head_labels ? " \u00b7 " + L.head_labels[h] : ""); }

  document.body.appendChild(el("header", {},
    el("h1", { text: DATA.title }),
    el("p", { text: DATA.model + " \u00b7 " + N + " tokens \u00b7 the attention a head would have " +
      "from the chosen bands and planes alone: softmax of their summed logits with the layer's own " +
      "score scale, soft-cap, mask, window and sinks, recomputed here from the captured q and k." })));
  const controls = el("section", { id: "controls" });
  const center = el("section", { id: "center" });
  const side = el("section", { id: "side" });
  document.body.appendChild(el("main", {}, controls, center, side));

  const layerSel = el("select", { id: "layer" });
  DATA.layers.forEach((L, i) => layerSel.appendChild(el("option", { value: String(i), text: "layer " + L.layer })));
  const headSel = el("select", { id: "head" });
  controls.appendChild(el("label", { class: "pick", text: "Layer" }, layerSel));
  controls.appendChild(el("label", { class: "pick", text: "Head" }, headSel));
  const allBtn = el("button", { type: "button", id: "all", text: "all bands" });
  const noneBtn = el("button", { type: "button", id: "none", text: "none" });
  controls.appendChild(el("div", { class: "pick", text: "Bands and planes (\u03bb: wavelength in tokens)" }));
  controls.appendChild(el("div", { class: "buttons" }, allBtn, noneBtn));
  const bandBox = el("div", { id: "bands" });
  controls.appendChild(bandBox);
  const precisionNote = el("p", { class: "note" });
  controls.appendChild(precisionNote);

  const wrap = el("div", { id: "heatmap-wrap" });
  const canvas = el("canvas", { id: "heatmap" });
  const tip = el("div", { id: "tip" });
  wrap.appendChild(canvas);
  wrap.appendChild(tip);
  center.appendChild(wrap);
  const status = el("p", { id: "status" });
  center.appendChild(status);

  side.appendChild(el("h2", { text: "Attention of one query over the keys" }));
  const rowTitle = el("p", { id: "row-title" });
  side.appendChild(rowTitle);
  const multiples = el("div", { id: "multiples" });
  side.appendChild(multiples);
  side.appendChild(el("h2", { text: "Band alone: top-1 agreement with the model", style: "margin-top:12px" }));
  const table = el("table", { id: "agreement" });
  side.appendChild(table);
  side.appendChild(el("p", { class: "note", text: "Share of queries whose most-attended key under the band " +
    "alone is the model's own (its full pattern as captured; k keys tied at the top count 1/k each); " +
    "n/a where the band holds no dimension." }));

  function buildHeads() {
    const L = layer();
    headSel.innerHTML = "";
    for (let h = 0; h < L.n_heads; h++) headSel.appendChild(el("option", { value: String(h), text: headLabel(L, h) }));
    S.head = Math.min(S.head, L.n_heads - 1);
    headSel.value = String(S.head);
  }
  function buildBands() {
    const L = layer();
    bandBox.innerHTML = "";
    L.bands.forEach((band, b) => {
      const box = el("input", { type: "checkbox", "data-band": String(b) });
      const waves = band.planes.map((p) => L.wavelength[p]);
      const span = band.planes.length
        ? "planes " + band.planes[0] + "\u2013" + band.planes[band.planes.length - 1] + ", \u03bb " +
          fmtWave(waves[0]) + "\u2013" + fmtWave(waves[waves.length - 1])
        : "";
      const meta = [span, band.extra.length ? band.extra.length + " non-rotary dims" : ""].filter(Boolean).join("; ");
      const div = el("div", { class: "band" + (band.planes.length || band.extra.length ? "" : " empty") },
        el("label", {}, box, document.createTextNode(" " + band.name + " "), el("span", { class: "meta", text: meta || "no dimension in this layer" })));
      const grid = el("div", { class: "planes" });
      band.planes.forEach((p) => {
        const pb = el("input", { type: "checkbox", "data-plane": String(p) });
        pb.addEventListener("change", () => { if (pb.checked) S.planes.add(p); else S.planes.delete(p); update(false); });
        grid.appendChild(el("label", { title: "plane " + p + ": dims " + L.plane_dims[p].join(", ") },
          pb, document.createTextNode(" " + p + " \u00b7 \u03bb " + fmtWave(L.wavelength[p]))));
      });
      if (band.extra.length) {
        const xb = el("input", { type: "checkbox", "data-extra": String(b) });
        xb.addEventListener("change", () => { if (xb.checked) S.extras.add(b); else S.extras.delete(b); update(false); });
        grid.appendChild(el("label", { title: "dims " + band.extra.join(", ") }, xb,
          document.createTextNode(" non-rotary (" + band.extra.length + ")")));
      }
      div.appendChild(grid);
      box.disabled = !(band.planes.length || band.extra.length);
      box.addEventListener("change", () => {
        band.planes.forEach((p) => (box.checked ? S.planes.add(p) : S.planes.delete(p)));
        if (band.extra.length) { if (box.checked) S.extras.add(b); else S.extras.delete(b); }
        update(false);
      });
      bandBox.appendChild(div);
    });
    precisionNote.textContent = "q and k of this layer are stored as " +
      (L.dtype === "int16" ? "16-bit integers with a scale per head and dim" : L.dtype) +
      (L.dtype === "float32" ? " (16 bits would move a probability by more than 0.001)." :
        " (every probability within 0.001 of float32's, checked when written).");
  }
  function syncBoxes() {
    bandBox.querySelectorAll("input[data-band]").forEach((box) => {
      const st = bandState(+box.dataset.band);
      box.checked = st === "on";
      box.indeterminate = st === "partial";
    });
    bandBox.querySelectorAll("input[data-plane]").forEach((pb) => { pb.checked = S.planes.has(+pb.dataset.plane); });
    bandBox.querySelectorAll("input[data-extra]").forEach((xb) => { xb.checked = S.extras.has(+xb.dataset.extra); });
  }

  // ------------------------------------------------------------------------------ the heatmap
  const CELL_TARGET = 540;
  const MARGIN = { left: 112, top: 112, right: 64, bottom: 30 };
  function geometry() {
    const cell = Math.max(1, Math.min(24, Math.floor(CELL_TARGET / N)));
    return { cell, size: cell * N };
  }
  function color(v) { // white -> dark blue, on a square-root scale (small probabilities stay visible)
    const t = Math.sqrt(Math.max(0, Math.min(1, v)));
    return [Math.round(255 - t * (255 - 8)), Math.round(255 - t * (255 - 48)), Math.round(255 - t * (255 - 107))];
  }
  function drawHeatmap() {
    const { cell, size } = geometry();
    const W = MARGIN.left + size + MARGIN.right;
    const H = MARGIN.top + size + MARGIN.bottom;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = W * dpr; canvas.height = H * dpr;
    canvas.style.width = W + "px"; canvas.style.height = H + "px";
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
    const img = ctx.createImageData(N, N);
    const mask = arrays(S.li).mask;
    for (let t = 0; t < N * N; t++) {
      const c = mask[t] ? color(S.drawn[t]) : [236, 238, 241];
      img.data[4 * t] = c[0]; img.data[4 * t + 1] = c[1]; img.data[4 * t + 2] = c[2]; img.data[4 * t + 3] = 255;
    }
    const off = document.createElement("canvas");
    off.width = N; off.height = N;
    off.getContext("2d").putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, MARGIN.left, MARGIN.top, size, size);
    ctx.strokeStyle = "#8c959f"; ctx.strokeRect(MARGIN.left - 0.5, MARGIN.top - 0.5, size + 1, size + 1);
    // the hovered query row
    ctx.strokeStyle = "#e36209"; ctx.lineWidth = 1.5;
    ctx.strokeRect(MARGIN.left - 3, MARGIN.top + S.row * cell - 0.5, size + 6, cell + 1);
    ctx.lineWidth = 1;
    // token labels: every k-th, k chosen so that labels are at least 11 px apart
    const every = Math.max(1, Math.ceil(11 / cell));
    ctx.fillStyle = "#1f2328"; ctx.font = "10px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    for (let i = 0; i < N; i += every) {
      ctx.textAlign = "right";
      ctx.fillText(tokenLabel(i, 12) + " " + i, MARGIN.left - 5, MARGIN.top + (i + 0.5) * cell);
      ctx.save();
      ctx.translate(MARGIN.left + (i + 0.5) * cell, MARGIN.top - 5);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(i + " " + tokenLabel(i, 12), 0, 0);
      ctx.restore();
    }
    ctx.font = "12px system-ui, sans-serif"; ctx.textAlign = "center";
    ctx.fillText("key token (position, text) \u2192", MARGIN.left + size / 2, 10);
    ctx.save();
    ctx.translate(12, MARGIN.top + size / 2);
    ctx.rotate(-Math.PI / 2);
    ctx.fillText("query token (position, text) \u2192", 0, 0);
    ctx.restore();
    // colour bar
    const bx = MARGIN.left + size + 18;
    const bh = Math.min(size, 240);
    for (let y = 0; y < bh; y++) {
      const c = color(Math.pow(1 - y / bh, 2));
      ctx.fillStyle = "rgb(" + c.join(",") + ")";
      ctx.fillRect(bx, MARGIN.top + y, 14, 1);
    }
    ctx.strokeStyle = "#8c959f"; ctx.strokeRect(bx - 0.5, MARGIN.top - 0.5, 15, bh + 1);
    ctx.fillStyle = "#1f2328"; ctx.font = "10px system-ui, sans-serif"; ctx.textAlign = "left";
    for (const v of [1, 0.5, 0.25, 0.1, 0.01, 0]) ctx.fillText(String(v), bx + 18, MARGIN.top + (1 - Math.sqrt(v)) * bh);
    ctx.fillText("attention", bx - 2, MARGIN.top + bh + 12);
  }
  function cellAt(ev) {
    const r = canvas.getBoundingClientRect();
    const { cell } = geometry();
    const i = Math.floor((ev.clientY - r.top - MARGIN.top) / cell);
    const j = Math.floor((ev.clientX - r.left - MARGIN.left) / cell);
    return i >= 0 && i < N && j >= 0 && j < N ? [i, j] : null;
  }
  canvas.addEventListener("mousemove", (ev) => {
    const at = cellAt(ev);
    if (!at) { tip.style.display = "none"; return; }
    const [i, j] = at;
    const allowed = arrays(S.li).mask[i * N + j];
    tip.textContent = "query " + quoted(i) + " \u2192 key " + quoted(j) + ": " +
      (allowed ? S.drawn[i * N + j].toFixed(4) : "masked");
    tip.style.display = "block";
    const r = canvas.getBoundingClientRect();
    tip.style.left = Math.min(ev.clientX - r.left + 14, r.width - 260) + "px";
    tip.style.top = ev.clientY - r.top + 14 + "px";
    if (!S.pinned && i !== S.row) { S.row = i; drawHeatmap(); drawRow(); }
  });
  canvas.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  canvas.addEventListener("click", (ev) => {
    const at = cellAt(ev);
    if (!at) return;
    S.pinned = !(S.pinned && S.row === at[0]);
    S.row = at[0];
    drawHeatmap(); drawRow();
  });

  // ------------------------------------------------------- one query's attention, band by band
  function rowOf(p, i) { return Array.from(p.subarray(i * N, (i + 1) * N)); }
  function linePlot(series, label, height) {
    const cv = el("canvas");
    const W = 520, H = height;
    const dpr = window.devicePixelRatio || 1;
    cv.width = W * dpr; cv.height = H * dpr; cv.style.height = H + "px";
    const ctx = cv.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const L = 34, R = 6, T = 4, B = label ? 30 : 6;
    const w = W - L - R, h = H - T - B;
    const hi = Math.max(1e-9, ...series.map((s) => Math.max(...s.values)));
    const top = hi > 0.5 ? 1 : Math.ceil(hi * 10) / 10 || 0.1;
    ctx.strokeStyle = "#d0d7de"; ctx.strokeRect(L - 0.5, T - 0.5, w + 1, h + 1);
    ctx.fillStyle = "#656d76"; ctx.font = "10px system-ui, sans-serif"; ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    ctx.fillText(top.toFixed(1), L - 3, T + 4); ctx.fillText("0", L - 3, T + h - 2);
    const x = (j) => L + (N === 1 ? w / 2 : (j / (N - 1)) * w);
    const y = (v) => T + h - (v / top) * h;
    ctx.strokeStyle = "#e36209"; ctx.setLineDash([2, 2]);
    ctx.beginPath(); ctx.moveTo(x(S.row), T); ctx.lineTo(x(S.row), T + h); ctx.stroke();
    ctx.setLineDash([]);
    for (const s of series) {
      ctx.strokeStyle = s.color; ctx.lineWidth = s.width || 1.2;
      if (s.dash) ctx.setLineDash(s.dash);
      ctx.beginPath();
      s.values.forEach((v, j) => (j ? ctx.lineTo(x(j), y(v)) : ctx.moveTo(x(j), y(v))));
      ctx.stroke(); ctx.setLineDash([]);
    }
    if (label) {
      ctx.fillStyle = "#1f2328"; ctx.textAlign = "center"; ctx.textBaseline = "top";
      const every = Math.max(1, Math.ceil(N / 8));
      for (let j = 0; j < N; j += every) ctx.fillText(String(j), x(j), T + h + 3);
      ctx.fillText("key position (query " + S.row + " at the dashed line)", L + w / 2, T + h + 16);
    }
    return cv;
  }
  function drawRow() {
    const i = S.row;
    const L = layer();
    const top = (p) => { let b = 0; for (let j = 1; j < N; j++) if (p[i * N + j] > p[i * N + b]) b = j; return b; };
    rowTitle.textContent = "Query " + quoted(i) + (S.pinned ? " (pinned: click again to follow the mouse)" : " (hover a row; click to pin)");
    multiples.innerHTML = "";
    const drawnTop = top(S.drawn), fullTop = top(S.full);
    multiples.appendChild(el("div", { class: "multiple" },
      el("div", { class: "name", text: "chosen bands (blue), all bands = the model (grey, dashed) \u00b7 top key " +
        quoted(drawnTop) + (drawnTop === fullTop ? "" : " (model: " + quoted(fullTop) + ")") }),
      linePlot([{ values: rowOf(S.full, i), color: "#8c959f", dash: [4, 3], width: 1.5 },
        { values: rowOf(S.drawn, i), color: "#0b3d91", width: 1.8 }], false, 90)));
    L.bands.forEach((band, b) => {
      const p = S.alone[b];
      const name = el("div", { class: "name", text: band.name + " alone" + (p ? " \u00b7 top key " + quoted(top(p)) : ": no dimension in this layer") });
      const last = b === L.bands.length - 1;
      multiples.appendChild(el("div", { class: "multiple" }, name,
        p ? linePlot([{ values: rowOf(p, i), color: COLORS[b % COLORS.length] }], last, last ? 84 : 54) : el("span")));
    });
  }

  // ------------------------------------------------------------------------ agreement table
  // Share of queries whose most-attended key under pattern p is the model's own (top: its key per
  // query). Keys tied at p's maximum share the pick: a query whose k tied keys include the model's
  // counts 1/k, as ropelens's Python agreement and band statistics count it.
  function topAgreement(p, top) {
    let hit = 0;
    for (let i = 0; i < N; i++) {
      let max = -Infinity;
      for (let j = 0; j < N; j++) if (p[i * N + j] > max) max = p[i * N + j];
      if (p[i * N + top[i]] !== max) continue;
      let tied = 0;
      for (let j = 0; j < N; j++) if (p[i * N + j] === max) tied++;
      hit += 1 / tied;
    }
    return hit / N;
  }
  function agreement() {
    const L = layer();
    const model = L.model_top1[S.head];
    return L.bands.map((band, b) => {
      const p = S.alone[b];
      return { band: band.name, top1: p ? topAgreement(p, model) : null };
    });
  }
  function drawTable() {
    const L = layer();
    table.innerHTML = "";
    table.appendChild(el("tr", {}, el("th", { text: "band" }), el("th", { text: "planes" }),
      el("th", { class: "num", text: "top-1 agreement" }), el("th", { text: "shown" })));
    agreement().forEach((r, b) => {
      const band = L.bands[b];
      const st = bandState(b);
      table.appendChild(el("tr", { class: st === "on" ? "on" : "" },
        el("td", { text: r.band }),
        el("td", { text: band.planes.length ? band.planes[0] + "\u2013" + band.planes[band.planes.length - 1] : band.extra.length ? "non-rotary" : "none" }),
        el("td", { class: "num", text: r.top1 === null ? "n/a" : (100 * r.top1).toFixed(1) + "%" }),
        el("td", { text: st === "empty" ? "" : st })));
    });
  }

  // ---------------------------------------------------------------------------------- updates
  function headChanged() { // patterns that do not depend on the chosen bands: all bands, each alone
    const L = layer();
    const every = new Int32Array(L.d_head).map((_, t) => t);
    S.full = pattern(S.li, S.head, every);
    S.fullTop = argmaxRows(S.full);
    S.alone = L.bands.map((_, b) => {
      const dims = bandDims(L, b);
      return dims.length ? pattern(S.li, S.head, Int32Array.from(dims)) : null;
    });
  }
  function update(headToo) {
    if (headToo) headChanged();
    S.drawn = pattern(S.li, S.head, chosenDims());
    syncBoxes();
    drawHeatmap();
    drawRow();
    drawTable();
    const L = layer();
    const same = topAgreement(S.drawn, L.model_top1[S.head]);
    const on = L.bands.filter((_, b) => bandState(b) === "on").map((b) => b.name.split(" ")[0]);
    status.textContent = "Layer " + L.layer + ", " + headLabel(L, S.head) + ": " + S.planes.size + " of " +
      L.plane_dims.length + " planes on" + (on.length ? " (bands " + on.join(", ") + ")" : "") +
      "; the drawn pattern's top key is the model's for " + (100 * same).toFixed(1) + "% of queries." +
      (L.window ? " Sliding window: " + L.window + " keys." : "") + (L.softcap ? " Soft-cap " + L.softcap + "." : "") +
      (L.sinks ? " Learned sink logit " + L.sinks[S.head].toFixed(3) + "." : "") + " Grey cells: masked.";
  }
  function setLayerIndex(li) {
    const keep = layer().bands.filter((_, b) => bandState(b) === "on").map((b) => b.name);
    S.li = li;
    layerSel.value = String(li);
    buildHeads();
    buildBands();
    const names = new Set(layer().bands.map((b) => b.name));
    select(keep.filter((n) => names.has(n)), []);
    update(true);
  }

  layerSel.addEventListener("change", () => setLayerIndex(+layerSel.value));
  headSel.addEventListener("change", () => { S.head = +headSel.value; update(true); });
  allBtn.addEventListener("click", () => { selectAll(); update(false); });
  noneBtn.addEventListener("click", () => { select([], []); update(false); });

  layerSel.value = String(S.li);
  buildHeads();
  buildBands();
  selectAll();
  update(true);
  // inside a page's frame (the report), say how tall the mixer is so the frame can fit it
  // (the height of what it draws, never the frame's: a height read from the viewport, such as
  // scrollHeight, would grow the frame by each answer)
  if (window.parent !== window) {
    document.documentElement.classList.add("framed");
    const page = document.querySelector("main");
    let told = 0;
    const tell = () => {
      const h = Math.ceil(page.getBoundingClientRect().bottom + window.scrollY);
      if (h !== told) { told = h; window.parent.postMessage({ ropelensMixerHeight: h }, "*"); }
    };
    tell();
    new ResizeObserver(tell).observe(page);
  }

  // ------------------------------------------------------------------------- for tests, scripts
  function layerIndex(L) {
    const li = DATA.layers.findIndex((x) => x.layer === L);
    if (li < 0) throw new Error("layer " + L + " is not on this page: it holds layers " + JSON.stringify(DATA.layers.map((x) => x.layer)));
    return li;
  }
  window.ropelensExplorer = {
    layers: () => DATA.layers.map((x) => x.layer),
    bandNames: () => layer().bands.map((b) => b.name),
    headLabels: () => layer().head_labels,
    tokens: () => DATA.tokens.slice(),
    precision: () => layer().dtype,
    setLayer(L) { setLayerIndex(layerIndex(L)); },
    setHead(h) {
      if (!Number.isInteger(h) || h < 0 || h >= layer().n_heads) throw new Error("head " + h + " is not a head of layer " + layer().layer);
      S.head = h; headSel.value = String(h); update(true);
    },
    setBands(names) { select(names, []); update(false); },
    setPlanes(planes) { select([], planes); update(false); },
    select(opts) { select((opts || {}).bands || [], (opts || {}).planes || []); update(false); },
    setRow(i) { S.row = i; S.pinned = true; drawHeatmap(); drawRow(); },
    state: () => ({ layer: layer().layer, head: S.head, planes: [...S.planes].sort((a, b) => a - b),
      bands: layer().bands.filter((_, b) => bandState(b) === "on").map((b) => b.name), row: S.row }),
    pattern: () => Array.from({ length: N }, (_, i) => rowOf(S.drawn, i)),
    agreement,
  };
})();
