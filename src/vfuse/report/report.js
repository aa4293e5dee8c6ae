// Interaction for the vfuse HTML report. The page is static: Python laid the graph out (Graphviz)
// and drew it; this script expands kernels in place, searches, filters decisions and fills the
// side panel from the JSON data block.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var svg = document.getElementById("graph");
  var panel = document.getElementById("panel");
  var kernels = {}, inners = {}, open = {};
  svg.querySelectorAll(".kernel").forEach(function (g) { kernels[g.dataset.id] = g; });
  svg.querySelectorAll(".inner").forEach(function (g) { inners[g.dataset.id] = g; });
  var edgePaths = [];
  svg.querySelectorAll(".edges path").forEach(function (p) { edgePaths.push([p, p.getAttribute("d")]); });

  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c];
    });
  }
  var graphbox = document.getElementById("graphbox");
  // Scroll the graph (not the page) so that `el` is in the middle of it, or near its top (`top`:
  // an expanded kernel, whose nodes follow below it).
  function reveal(el, top) {
    var r = el.getBoundingClientRect(), b = graphbox.getBoundingClientRect();
    graphbox.scrollTop += r.top - b.top - (top ? 24 : (b.height - r.height) / 2);
    graphbox.scrollLeft += r.left - b.left - (b.width - r.width) / 2;
  }
  function names(list) { return list.map(function (n) { return "%" + n; }).join(", "); }
  function geom(g) { return { x: +g.dataset.x, y: +g.dataset.y, w: +g.dataset.w, h: +g.dataset.h }; }

  // ---- expanding kernels in place -------------------------------------------------------
  // An expanded kernel's nodes go in a band right below its box; everything lower moves down by
  // the band's height (boxes and edge points alike), so nothing overlaps. Kernels of one rank
  // stack their bands.
  var GAP = 10;
  function relayout() {
    var list = Object.keys(open).map(function (id) {
      var g = geom(kernels[id]), inner = inners[id];
      return { id: id, bottom: g.y + g.h, x: g.x, w: g.w, iw: +inner.dataset.w, delta: +inner.dataset.h + 2 * GAP };
    }).sort(function (a, b) { return a.bottom - b.bottom || a.x - b.x; });
    function shift(y) {
      var s = 0;
      list.forEach(function (e) { if (e.bottom < y - 0.5) s += e.delta; });
      return s;
    }
    Object.keys(kernels).forEach(function (id) {
      var g = geom(kernels[id]);
      kernels[id].setAttribute("transform", "translate(" + g.x + "," + (g.y + shift(g.y)) + ")");
      kernels[id].classList.toggle("open", !!open[id]);
      var label = kernels[id].querySelector(".toggle text");
      label.textContent = (open[id] ? "− " : "+ ") + label.textContent.slice(2);
    });
    var width = +svg.dataset.w, extra = 0;
    Object.keys(inners).forEach(function (id) { inners[id].style.display = open[id] ? "" : "none"; });
    list.forEach(function (e, i) {
      var same = 0;
      for (var j = 0; j < i; j++) if (Math.abs(list[j].bottom - e.bottom) < 0.5) same += list[j].delta;
      var left = Math.max(6, e.x + e.w / 2 - e.iw / 2);
      inners[e.id].setAttribute("transform", "translate(" + left + "," + (e.bottom + shift(e.bottom) + same + GAP) + ")");
      width = Math.max(width, left + e.iw + 6);
      extra += e.delta;
    });
    edgePaths.forEach(function (pd) {
      pd[0].setAttribute("d", pd[1].replace(/(-?[\d.]+),(-?[\d.]+)/g, function (m, x, y) {
        return x + "," + (+y + shift(+y)).toFixed(1);
      }));
    });
    var height = +svg.dataset.h + extra;
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
  }
  function setOpen(id, on) {
    if (on) open[id] = true; else delete open[id];
    relayout();
  }

  // ---- the side panel ---------------------------------------------------------------------
  var BASIC = ["producer", "consumer", "accepted", "rule", "meaning", "reason", "gain_s", "gain", "horizontal"];
  function decisionHtml(i) {
    var d = data.decisions[i];
    var figs = Object.keys(d).filter(function (k) { return BASIC.indexOf(k) < 0; })
      .map(function (k) { return esc(k) + "=" + esc(d[k]); });
    return '<div class="dec ' + (d.accepted ? "accepted" : "rejected") + '">' +
      '<span class="' + (d.accepted ? "ok" : "no") + '">#' + i + " " + (d.accepted ? "accepted" : "rejected") +
      (d.horizontal ? " (horizontal)" : "") + '</span> <span class="rule" title="' + esc(d.meaning) + '">' +
      esc(d.rule) + "</span><div>" + esc(names(d.producer)) + " → " + esc(names(d.consumer)) + "</div>" +
      (d.reason ? "<div>" + esc(d.reason) + "</div>" : "") +
      '<div class="fig">gain ' + esc(d.gain) + (figs.length ? " · " + figs.join(" · ") : "") + "</div></div>";
  }
  function decisionsOf(nodes) {
    var set = {}, out = [];
    nodes.forEach(function (n) { set[n] = true; });
    data.decisions.forEach(function (d, i) {
      if (d.producer.concat(d.consumer).some(function (n) { return set[n]; })) out.push(i);
    });
    return out;
  }
  function decisionsBlock(ids) {
    var shown = ids.slice(0, 40).map(decisionHtml).join("");
    var more = ids.length > 40 ? '<p class="hint">' + (ids.length - 40) + " more: filter the decision table below.</p>" : "";
    return "<b>" + ids.length + " decision" + (ids.length === 1 ? "" : "s") + "</b>" +
      (ids.length ? shown + more : '<p class="hint">No decision involves it.</p>');
  }
  function kernelHtml(k) {
    var others = k.modules.filter(function (m) { return m !== k.module; });
    var runs = k.native ? k.runs + " kernel in native call " + esc(k.segment) : "torch (" + esc(k.note) + ")";
    var split = k.siblings.length ? "; the group runs as several kernels, also " +
      k.siblings.map(function (i) { return "#" + i; }).join(", ") : "";
    var src = k.source ? '<button type="button" id="show-src">generated C++ (' + esc(k.name) + ")</button>" +
      '<pre id="src" hidden>' + esc(k.source) + "</pre>" : '<p class="hint">No generated code: torch runs it.</p>';
    return "<h3>#" + k.id + " · " + esc(k.name) + " — " + esc(k.pattern) + '</h3><div class="facts">' +
      "<b>module</b> " + esc(k.module || "?") + (others.length ? " (also " + esc(others.join(", ")) + ")" : "") +
      "<br><b>runs</b> " + runs + "<br><b>planner group</b> " + k.group + " (" + esc(k.label) + ")" + split +
      "<br><b>predicted</b> " + esc(k.time) + ", " + esc(k.bytes) + ", " + esc(k.bound) + "-bound" +
      '<br><b>measured</b> <span id="measured">' + esc(k.measured || data.notProfiled) +
      (k.ratio ? " (predicted / measured = " + esc(k.ratio) + ")" : "") + "</span>" +
      "<br><b>reads</b> " + esc(names(k.reads)) + "<br><b>writes</b> " + esc(names(k.writes)) +
      "<br><b>" + k.nodes.length + " ops</b> " + esc(k.nodes.map(function (n) { return data.nodes[n].op; }).join(" > ")) +
      "</div>" + src + decisionsBlock(decisionsOf(k.nodes));
  }
  function nodeHtml(n) {
    var info = data.nodes[n];
    return "<h3>%" + esc(n) + " = " + esc(info.op) + '</h3><div class="facts">' + esc(info.type) + " · " +
      esc(info.bytes) + (info.output ? " · graph output" : "") + "<br><b>module</b> " + esc(info.module || "?") +
      (info.line ? "<br><b>source</b> " + esc(info.line) : "") + "<br><b>computed in</b> " +
      (info.kernels.length ? info.kernels.map(function (i) { return "#" + i + " " + esc(data.kernels[i].name) + " (" + esc(data.kernels[i].pattern) + ")"; }).join(", ") : "no kernel (input)") +
      "</div>" + decisionsBlock(decisionsOf([n]));
  }

  // ---- selection ----------------------------------------------------------------------------
  function clearMarks(cls) { document.querySelectorAll("." + cls).forEach(function (e) { e.classList.remove(cls); }); }
  function selectKernel(id, scroll) {
    clearMarks("sel"); clearMarks("hl");
    var k = data.kernels[id];
    panel.innerHTML = kernelHtml(k);
    var btn = document.getElementById("show-src");
    if (btn) btn.addEventListener("click", function () { var pre = document.getElementById("src"); pre.hidden = !pre.hidden; });
    kernels[id].classList.add("sel");
    svg.querySelectorAll('.edges .edge[data-from="' + id + '"], .edges .edge[data-to="' + id + '"]').forEach(function (e) { e.classList.add("hl"); });
    var row = document.querySelector('#kernels tr[data-kernel="' + id + '"]');
    if (row) row.classList.add("hl");
    if (scroll) reveal(kernels[id]);
  }
  function selectNode(el) {
    clearMarks("sel");
    el.classList.add("sel");
    panel.innerHTML = nodeHtml(el.dataset.node);
  }
  svg.addEventListener("click", function (ev) {
    var t = ev.target.closest ? ev.target : null;
    if (!t) return;
    var toggle = t.closest(".toggle"), kernel = t.closest(".kernel"), node = t.closest(".node");
    if (toggle && kernel) setOpen(kernel.dataset.id, !open[kernel.dataset.id]);
    if (kernel) selectKernel(kernel.dataset.id, false);
    else if (node) selectNode(node);
  });
  svg.addEventListener("dblclick", function (ev) {
    var kernel = ev.target.closest && ev.target.closest(".kernel");
    if (kernel && !ev.target.closest(".toggle")) setOpen(kernel.dataset.id, !open[kernel.dataset.id]);
  });
  svg.addEventListener("keydown", function (ev) {
    var kernel = ev.target.closest && ev.target.closest(".kernel");
    if (!kernel) return;
    if (ev.key === "Enter") selectKernel(kernel.dataset.id, false);
    if (ev.key === " ") { ev.preventDefault(); setOpen(kernel.dataset.id, !open[kernel.dataset.id]); }
  });
  document.querySelectorAll("#kernels tr[data-kernel]").forEach(function (row) {
    row.addEventListener("click", function () { selectKernel(row.dataset.kernel, true); });
  });
  // A decision row marks the kernels that compute its producer and consumer.
  document.querySelectorAll("#decisions tr[data-decision]").forEach(function (row) {
    row.addEventListener("mouseenter", function () {
      clearMarks("hl");
      var d = data.decisions[+row.dataset.decision];
      row.classList.add("hl");
      d.producer.concat(d.consumer).forEach(function (n) {
        data.nodes[n].kernels.forEach(function (i) { kernels[i].classList.add("hl"); });
      });
    });
  });
  document.getElementById("expand-all").addEventListener("click", function () {
    Object.keys(kernels).forEach(function (id) { open[id] = true; });
    relayout();
  });
  document.getElementById("collapse-all").addEventListener("click", function () { open = {}; relayout(); });

  // ---- search ------------------------------------------------------------------------------
  var search = document.getElementById("search"), count = document.getElementById("matches");
  function runSearch() {
    var q = search.value.trim().toLowerCase();
    clearMarks("match");
    svg.classList.toggle("searching", q.length > 0);
    if (!q) { count.textContent = ""; return; }
    var hits = data.kernels.filter(function (k) { return k.search.indexOf(q) >= 0; });
    hits.forEach(function (k) {
      kernels[k.id].classList.add("match");
      var row = document.querySelector('#kernels tr[data-kernel="' + k.id + '"]');
      if (row) row.classList.add("match");
    });
    svg.querySelectorAll(".node").forEach(function (g) {
      var n = g.dataset.node, info = data.nodes[n];
      if ((n + " " + info.op + " " + info.module).toLowerCase().indexOf(q) >= 0) g.classList.add("match");
    });
    count.textContent = hits.length + " kernel" + (hits.length === 1 ? "" : "s") + " match";
    if (hits.length) reveal(kernels[hits[0].id]);
  }
  search.addEventListener("input", runSearch);

  // ---- decision filters ---------------------------------------------------------------------
  var fVerdict = document.getElementById("f-verdict"), fRule = document.getElementById("f-rule");
  var fNode = document.getElementById("f-node"), fCount = document.getElementById("f-count");
  function filterDecisions() {
    var rows = document.querySelectorAll("#decisions tr[data-decision]"), shown = 0;
    var node = fNode.value.trim().toLowerCase();
    rows.forEach(function (row) {
      var ok = (!fVerdict.value || row.dataset.verdict === fVerdict.value) &&
        (!fRule.value || row.dataset.rule === fRule.value) && (!node || row.dataset.nodes.indexOf(node) >= 0);
      row.style.display = ok ? "" : "none";
      if (ok) shown++;
    });
    fCount.textContent = "showing " + shown + " of " + rows.length;
  }
  [fVerdict, fRule].forEach(function (el) { el.addEventListener("change", filterDecisions); });
  fNode.addEventListener("input", filterDecisions);
  filterDecisions();

  // ---- links: #kernel=ID, #node=NAME, #search=TEXT ------------------------------------------
  function follow() {
    var m = /^#(kernel|node|search)=(.+)$/.exec(decodeURIComponent(location.hash));
    if (!m) return;
    if (m[1] === "search") { search.value = m[2]; runSearch(); return; }
    var id = m[1] === "kernel" ? m[2] : (data.nodes[m[2]] || { kernels: [] }).kernels[0];
    if (id === undefined || !kernels[id]) return;
    setOpen(String(id), true);
    selectKernel(String(id), false);
    reveal(kernels[id], true);
    if (m[1] === "node") {
      var el = inners[id].querySelector('.node[data-node="' + CSS.escape(m[2]) + '"]');
      if (el) { selectNode(el); reveal(el); }
    }
  }
  window.addEventListener("hashchange", follow);
  // Wide graphs open centred on their first kernels rather than at the left edge.
  graphbox.scrollLeft = Math.max(0, (graphbox.scrollWidth - graphbox.clientWidth) / 2);
  follow();
})();
