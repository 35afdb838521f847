/* page.js - the container picture's panels, drawn from the JSON data block.
 * Every container string is shown with textContent (never parsed as HTML).
 * State lives in the URL hash: #region=text&page=12. */
"use strict";
(function () {
  var D = JSON.parse(document.getElementById("jlm-data").textContent);
  var SVG = "http://www.w3.org/2000/svg";
  var ARRAYS = { text: "text", vision: "vision", experts: "experts" };
  var RES_NAME = { text: "blocks", vision: "vision", experts: "experts" };
  var sortKey = "index", sortDir = 1;

  /* ------------------------------------------------------------ helpers */
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function svg(tag, attrs) {
    var e = document.createElementNS(SVG, tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    return e;
  }
  function clear(e) { while (e.firstChild) e.removeChild(e.firstChild); return e; }
  /* plain decimal bytes first; hex and MiB follow */
  function bytes(n) {
    var s = el("span", { "class": "bytes" }, String(n));
    s.appendChild(el("small", null, "  0x" + n.toString(16) + ", " + (n / 1048576).toFixed(3) + " MiB"));
    return s;
  }
  function dl(rows) {
    var d = el("dl");
    rows.forEach(function (r) {
      d.appendChild(el("dt", null, r[0]));
      var dd = el("dd", r[2] ? { id: r[2] } : null);
      if (r[1] instanceof Node) dd.appendChild(r[1]); else dd.textContent = String(r[1]);
      d.appendChild(dd);
    });
    return d;
  }
  function fields(obj) {
    return dl(Object.keys(obj || {}).map(function (k) { return [k, obj[k]]; }));
  }
  function table(id, heads, rows, sortable) {
    var t = el("table", id ? { id: id } : null), tr = el("tr");
    heads.forEach(function (h) {
      var th = el("th", sortable ? { "class": "sortable", "data-key": h[1] } : null, h[0]);
      if (sortable) th.addEventListener("click", function () {
        sortDir = sortKey === h[1] ? -sortDir : 1; sortKey = h[1]; render();
      });
      tr.appendChild(th);
    });
    t.appendChild(el("thead")).appendChild(tr);
    var tb = t.appendChild(el("tbody"));
    rows.forEach(function (r) {
      var row = tb.appendChild(el("tr"));
      r.forEach(function (c, i) {
        var td = row.appendChild(el("td", { "class": heads[i][2] || "" }));
        if (c instanceof Node) td.appendChild(c); else td.textContent = String(c);
      });
    });
    return t;
  }
  function shape(t) { return t.dims.join(" x "); }
  function regionOf(id) {
    for (var i = 0; i < D.regions.length; i++) if (D.regions[i].id === id) return D.regions[i];
    return null;
  }
  function hashState() {
    var st = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
      var p = kv.split("=");
      if (p[0]) st[decodeURIComponent(p[0])] = decodeURIComponent(p[1] || "");
    });
    return { region: regionOf(st.region) ? st.region : null, page: st.page !== undefined ? parseInt(st.page, 10) : -1 };
  }
  function go(region, page) {
    location.hash = "region=" + region + (page >= 0 ? "&page=" + page : "");
  }

  /* ------------------------------------------------------------ pages */
  /* tensors on page p of an array; a bank spans npages consecutive pages,
   * its planes repeated at + k x page_size (jlm-format.md 5) */
  function pageTensors(arr, p) {
    var A = D.arrays[arr], out = [];
    D.tensors.forEach(function (t, i) {
      if (t.region !== arr || p < t.page || p >= t.page + t.npages) return;
      var k = (p - t.page) * A.page_size;
      out.push({ i: i, t: t, qs: t.qs_off + k, d: t.d_off + k, sc: t.sc_off + k });
    });
    return out;
  }
  /* experts: page (rank(b) x NExpert + x) -> block b and expert x, from the banks */
  function expertRows() {
    var A = D.arrays.experts, rows = {};
    D.tensors.forEach(function (t) {
      if (t.region === "experts" && A.n_expert) rows[Math.floor(t.page / A.n_expert)] = t.block;
    });
    return rows;
  }
  function resName(arr, p) {
    if (arr !== "experts") return RES_NAME[arr] + "." + p;
    var A = D.arrays.experts, rows = expertRows(), r = Math.floor(p / A.n_expert);
    return "experts." + (rows[r] !== undefined ? rows[r] : r) + "." + (p % A.n_expert);
  }
  function residency() {
    var R = D.residency;
    if (!R) return null;
    var now = {}, pages = {};
    (R.resident || []).forEach(function (n) { now[n] = true; });
    (R.pages || []).forEach(function (pg) { pages[pg.name] = pg; });
    return { now: now, pages: pages };
  }
  function resClass(res, name) {
    if (!res) return "";
    if (res.now[name]) return " res-now";
    var pg = res.pages[name];
    return pg && pg.page_ins > 0 ? " res-touched" : " res-never";
  }

  /* ------------------------------------------------------------ grid of an array */
  function drawGrid(arr, sel) {
    var A = D.arrays[arr], g = clear(document.getElementById("grid"));
    var res = residency();
    g.className = arr + (res ? " overlay" : "");
    if (!A.n) return;
    var cols = arr === "experts" ? A.n_expert : Math.min(A.n, 32);
    var rows = Math.ceil(A.n / cols), cell = cols > 64 ? 10 : cols > 32 ? 14 : 22, left = 56;
    var s = svg("svg", { width: left + cols * cell + 2, height: rows * cell + 2, id: "grid-svg" });
    var blocks = arr === "experts" ? expertRows() : null;
    for (var r = 0; r < rows; r++) {
      var lab = svg("text", { x: 2, y: r * cell + cell * 0.75 });
      lab.textContent = arr === "experts" ? "blk " + (blocks[r] !== undefined ? blocks[r] : "?") : String(r * cols);
      s.appendChild(lab);
    }
    for (var p = 0; p < A.n; p++) {
      var name = resName(arr, p);
      var c = svg("rect", { x: left + (p % cols) * cell, y: Math.floor(p / cols) * cell, width: cell, height: cell,
        "class": "cell" + (A.extents[p] ? " used" : "") + resClass(res, name) + (p === sel ? " sel" : ""),
        "data-page": p, "data-name": name });
      var tt = svg("title");
      tt.textContent = "page " + p + " (" + name + ")" + (res && res.pages[name] ?
        ": " + res.pages[name].page_ins + " page-ins, " + res.pages[name].hits + " hits" : "");
      c.appendChild(tt);
      c.addEventListener("mouseenter", hoverPage);
      c.addEventListener("mouseleave", unhoverPage);
      c.addEventListener("click", function (ev) { go(arr, +ev.target.getAttribute("data-page")); });
      s.appendChild(c);
    }
    g.appendChild(el("h3", null, A.n + " pages of " + A.page_size + " bytes" +
      (arr === "experts" ? ", one row per MoE block, " + A.n_expert + " experts" : "")));
    g.appendChild(s);
    if (res) g.appendChild(legend(arr, res));
  }
  function legend(arr, res) {
    var L = el("p", { "class": "legend", id: "legend" }), A = D.arrays[arr], counts = [0, 0, 0];
    for (var p = 0; p < A.n; p++) {
      var n = resName(arr, p);
      counts[res.now[n] ? 0 : res.pages[n] && res.pages[n].page_ins > 0 ? 1 : 2]++;
    }
    ["resident now", "paged in", "never touched"].forEach(function (t, i) {
      L.appendChild(el("span", { "class": ["res-now", "res-touched", "res-never"][i] }));
      L.appendChild(el("b", { id: "count-" + ["now", "touched", "never"][i] }, counts[i]));
      L.appendChild(document.createTextNode(" " + t));
    });
    var T = D.residency.totals || {};
    L.appendChild(document.createTextNode("; as of " + D.residency.as_of + "; model totals: " + (T.page_ins || 0) + " page-ins, " + (T.hits || 0) +
      " hits, " + (T.evictions || 0) + " evictions, " + (D.residency.sessions || 0) + " live sessions"));
    return L;
  }
  function hoverPage(ev) {
    ev.target.classList.add("hover");
    drawPage(hashState().region, +ev.target.getAttribute("data-page"));
  }
  function unhoverPage(ev) {
    ev.target.classList.remove("hover");
    var st = hashState();
    drawPage(st.region, st.page);
  }

  /* ------------------------------------------------------------ one page */
  function drawPage(arr, p) {
    var P = clear(document.getElementById("page-detail"));
    var A = ARRAYS[arr] ? D.arrays[arr] : null;
    if (!A || p < 0 || p >= A.n) {
      if (A && A.n) P.appendChild(el("p", { "class": "note" }, "Point at a page, or click it to keep it selected."));
      return;
    }
    var off = A.base + p * A.page_size, len = A.extents[p], name = resName(arr, p);
    P.appendChild(el("h2", null, arr + " page " + p));
    var rows = [["index", p, "page-index"], ["name", name, "page-name"], ["offset", bytes(off), "page-off"],
      ["length read", bytes(len), "page-len"],
      ["span", "[" + off + ", " + (off + len) + ")", "page-span"], ["page size", bytes(A.page_size), "page-size"],
      ["end padding", bytes(A.page_size - len), "page-pad"]];
    var res = residency();
    if (res) {
      var pg = res.pages[name];
      rows.push(["residency", res.now[name] ? "resident now" : pg && pg.page_ins ? "paged in before" : "never touched",
        "page-res"]);
      if (pg) rows.push(["counters", pg.page_ins + " page-ins, " + pg.hits + " hits (hit rate " +
        (pg.hits + pg.page_ins ? (100 * pg.hits / (pg.hits + pg.page_ins)).toFixed(1) : "0") + "%), " +
        pg.evictions + " evictions", "page-counters"]);
    }
    P.appendChild(dl(rows));
    var ts = pageTensors(arr, p);
    P.appendChild(table("page-tensors", [["tensor"], ["type"], ["shape"], ["qs off", "", "num"], ["qs len", "", "num"],
      ["d off", "", "num"], ["d len", "", "num"], ["sc off", "", "num"], ["sc len", "", "num"]],
      ts.map(function (x) {
        return [x.t.name, x.t.type, shape(x.t), x.qs, x.t.qs_len, x.d, x.t.d_len, x.sc, x.t.sc_len];
      })));
  }

  /* ------------------------------------------------------------ region contents */
  function tensorTable(list, id) {
    var rows = list.slice().sort(function (a, b) {
      var x = sortKey === "index" ? a.i : a.t[sortKey], y = sortKey === "index" ? b.i : b.t[sortKey];
      if (sortKey === "dims") { x = a.t.dims.reduce(function (m, v) { return m * v; }, 1);
        y = b.t.dims.reduce(function (m, v) { return m * v; }, 1); }
      return (x < y ? -1 : x > y ? 1 : 0) * sortDir;
    });
    return table(id, [["#", "index", "num"], ["name", "name"], ["role", "role_name"], ["block", "block", "num"],
      ["type", "type"], ["shape", "dims"], ["region", "region"], ["page", "page", "num"], ["qs off", "qs_off", "num"],
      ["qs len", "qs_len", "num"]],
      rows.map(function (x) {
        var t = x.t;
        return [x.i, t.name, t.role_name, t.block, t.type, shape(t), t.region, t.page, t.qs_off, t.qs_len];
      }), true);
  }
  function contents(id) {
    var f = document.createDocumentFragment(), all = D.tensors.map(function (t, i) { return { i: i, t: t }; });
    if (id === "header") f.appendChild(fields(D.header));
    else if (id === "config") f.appendChild(fields(D.config));
    else if (id === "vision-record") f.appendChild(D.vision_record ? fields(D.vision_record) :
      el("p", { "class": "note" }, "No vision tower."));
    else if (id === "fingerprint") f.appendChild(fields(D.fingerprint));
    else if (id === "vocab") {
      var v = D.vocab;
      f.appendChild(dl([["kind", v.kind], ["tokens", v.n_tokens], ["merges", v.n_merges], ["added tokens", v.n_added],
        ["bos / eos", v.bos + " / " + v.eos], ["pre-tokenizer", v.pre]]));
      f.appendChild(el("h3", null, v.templates.length + " chat template(s)"));
      var ul = f.appendChild(el("ul", { id: "templates" }));
      v.templates.forEach(function (n) { ul.appendChild(el("li", null, n === "" ? "(default)" : n)); });
    } else if (id === "table") f.appendChild(tensorTable(all, "tensor-table"));
    else if (id === "dense") f.appendChild(tensorTable(all.filter(function (x) { return x.t.region === "dense"; }),
      "dense-tensors"));
    else if (ARRAYS[id]) {
      var A = D.arrays[id];
      f.appendChild(dl([["pages", A.n], ["page size", bytes(A.page_size)], ["first page at", bytes(A.base)]]));
    }
    return f;
  }

  /* ------------------------------------------------------------ the whole page */
  function render() {
    var st = hashState(), id = st.region;
    Array.prototype.forEach.call(document.querySelectorAll(".sel"), function (e) { e.classList.remove("sel"); });
    var R = clear(document.getElementById("region-detail")), C = clear(document.getElementById("region-contents"));
    clear(document.getElementById("grid"));
    clear(document.getElementById("page-detail"));
    if (!id) {
      R.appendChild(el("p", { "class": "note" }, "Select a region, or point at a page."));
      return;
    }
    Array.prototype.forEach.call(document.querySelectorAll('[data-region="' + id + '"]'),
      function (e) { e.classList.add("sel"); });
    var row = document.getElementById("row-" + id);
    if (row) row.classList.add("sel");
    var r = regionOf(id);
    R.appendChild(el("h2", { id: "sel-region" }, r.label));
    R.appendChild(dl([["region", r.id, "sel-id"], ["offset", bytes(r.off), "sel-off"], ["length", bytes(r.len), "sel-len"],
      ["end", bytes(r.off + r.len), "sel-end"], ["alignment", r.align, "sel-align"]]));
    (ARRAYS[id] ? R : C).appendChild(contents(id));   /* an array's summary is short: beside the table */
    if (ARRAYS[id]) {
      drawGrid(id, st.page);
      drawPage(id, st.page);
    }
  }
  window.addEventListener("hashchange", render);
  /* the overlay is as of generation: reload (the hash, hence the selection,
   * survives); ?refresh=N reloads every N seconds */
  document.getElementById("reload").addEventListener("click", function () { location.reload(); });
  var every = /[?&]refresh=(\d+)/.exec(location.search);
  if (every && +every[1] > 0) setTimeout(function () { location.reload(); }, +every[1] * 1000);
  render();
})();
