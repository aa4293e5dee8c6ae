// Interaction for the vfuse HTML report: show the planner decisions behind a node or an edge.
// The page is static; this script only reads the JSON data block and the SVG's data-* attributes.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var svg = document.getElementById("graph");
  var panel = document.getElementById("panel");
  var pinned = null; // the element whose details stay shown when the mouse leaves

  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c];
    });
  }
  function names(list) {
    return list.map(function (n) { return "%" + n; }).join(", ");
  }
  function involvesNode(d, n) {
    return d.producer.indexOf(n) >= 0 || d.consumer.indexOf(n) >= 0;
  }
  function involvesEdge(d, a, b) {
    var p = d.producer, c = d.consumer;
    return (p.indexOf(a) >= 0 && c.indexOf(b) >= 0) || (p.indexOf(b) >= 0 && c.indexOf(a) >= 0);
  }
  function decisionsWhere(test) {
    var out = [];
    data.decisions.forEach(function (d, i) { if (test(d)) out.push(i); });
    return out;
  }

  // Every Decision field beyond the basic ones is a figure the planner chose to log: show it.
  var BASIC = ["producer", "consumer", "accepted", "rule", "reason", "gain_s", "gain", "horizontal"];
  function decisionHtml(i) {
    var d = data.decisions[i];
    var figs = Object.keys(d).filter(function (k) { return BASIC.indexOf(k) < 0; })
      .map(function (k) { return esc(k) + "=" + esc(d[k]); });
    return '<div class="dec ' + (d.accepted ? "accepted" : "rejected") + '">' +
      '<span class="' + (d.accepted ? "ok" : "no") + '">#' + i + " " + (d.accepted ? "accepted" : "rejected") +
      (d.horizontal ? " (horizontal)" : "") + '</span> <span class="rule">' + esc(d.rule) + "</span>" +
      "<div>" + esc(names(d.producer)) + " → " + esc(names(d.consumer)) + "</div>" +
      (d.reason ? "<div>" + esc(d.reason) + "</div>" : "") +
      '<div class="fig">gain ' + esc(d.gain) + (figs.length ? " · " + figs.join(" · ") : "") + "</div></div>";
  }
  function groupFacts(gids) {
    if (!gids.length) return "not in any kernel";
    return (gids.length > 1 ? "recomputed in " + gids.length + " kernels:<br>" : "") + gids.map(function (gid) {
      var g = data.groups[String(gid)];
      return "kernel " + gid + " (" + esc(g.label) + ", " + esc(g.kind) + "): " + esc(g.time) + ", " +
        esc(g.bytes) + ", " + esc(g.bound) + "-bound, " + g.nodes.length + " ops";
    }).join("<br>");
  }
  function show(title, facts, ids) {
    var body = ids.length ? ids.map(decisionHtml).join("") :
      '<p class="hint">No decision involves it: the planner never considered a merge here.</p>';
    panel.innerHTML = "<h3>" + title + '</h3><div class="facts">' + facts + "</div>" +
      "<b>" + ids.length + " decision" + (ids.length === 1 ? "" : "s") + "</b>" + body;
  }

  function describe(el) {
    if (el.dataset.node !== undefined) {
      var n = el.dataset.node, info = data.nodes[n];
      var mine = decisionsWhere(function (d) { return involvesNode(d, n); });
      show("%" + esc(n) + " = " + esc(info.op), esc(info.type) + " · " + esc(info.bytes) +
        (info.output ? " · graph output" : "") + "<br>" + groupFacts(info.groups), mine);
      return { nodes: [n], ids: mine };
    }
    var a = el.dataset.from, b = el.dataset.to, kind = el.getAttribute("class").split(" ")[1];
    var words = { fused: "fused: stays on chip", dram: "materialized: written to DRAM, read back", input: "graph input read from DRAM" };
    var ids = decisionsWhere(function (d) { return involvesEdge(d, a, b); });
    show("%" + esc(a) + " → %" + esc(b), esc(data.nodes[a].type) + " · " + esc(data.nodes[a].bytes) +
      " · " + words[kind], ids);
    return { nodes: [a, b], ids: ids };
  }

  function highlight(el, sel) {
    clear();
    if (!el) return;
    svg.classList.add("dim");
    el.classList.add("hl");
    var nodes = {};
    sel.nodes.forEach(function (n) { nodes[n] = true; });
    sel.ids.forEach(function (i) {
      var d = data.decisions[i];
      d.producer.concat(d.consumer).forEach(function (n) { nodes[n] = true; });
      var row = document.querySelector('tr[data-decision="' + i + '"]');
      if (row) row.classList.add("hl");
    });
    svg.querySelectorAll(".node").forEach(function (g) { if (nodes[g.dataset.node]) g.classList.add("hl"); });
    svg.querySelectorAll(".edge").forEach(function (e) { if (nodes[e.dataset.from] && nodes[e.dataset.to]) e.classList.add("hl"); });
    el.classList.add("sel");
  }
  function clear() {
    svg.classList.remove("dim");
    document.querySelectorAll(".hl, .sel").forEach(function (e) { e.classList.remove("hl", "sel"); });
  }
  function target(ev) { return ev.target.closest ? ev.target.closest(".node, .edge") : null; }
  function restore() {
    if (pinned) highlight(pinned, describe(pinned));
    else { clear(); panel.innerHTML = '<h3>Decisions</h3><p class="hint">Hover or click a node or an edge.</p>'; }
  }

  svg.addEventListener("mouseover", function (ev) { var el = target(ev); if (el) highlight(el, describe(el)); });
  svg.addEventListener("mouseout", function (ev) {
    // Moving between the parts of one node or edge (box, text, hit area) is not leaving it.
    var from = target(ev), to = ev.relatedTarget && ev.relatedTarget.closest ? ev.relatedTarget.closest(".node, .edge") : null;
    if (from && from !== to) restore();
  });
  svg.addEventListener("click", function (ev) { pinned = target(ev); restore(); });
  // Keyboard: Tab moves between nodes and edges (tabindex=0), Enter pins the focused one.
  svg.addEventListener("focusin", function (ev) { var el = target(ev); if (el) highlight(el, describe(el)); });
  svg.addEventListener("focusout", restore);
  svg.addEventListener("keydown", function (ev) { if (ev.key === "Enter") { pinned = target(ev); restore(); } });

  // Table rows highlight what they name: a kernel's nodes, or a decision's producer and consumer.
  document.querySelectorAll("tr[data-group], tr[data-decision]").forEach(function (row) {
    row.addEventListener("mouseenter", function () {
      var set = {};
      if (row.dataset.group !== undefined) data.groups[row.dataset.group].nodes.forEach(function (n) { set[n] = true; });
      else {
        var d = data.decisions[Number(row.dataset.decision)];
        d.producer.concat(d.consumer).forEach(function (n) { set[n] = true; });
      }
      clear();
      svg.classList.add("dim");
      row.classList.add("hl");
      svg.querySelectorAll(".node").forEach(function (g) { if (set[g.dataset.node]) g.classList.add("hl"); });
    });
    row.addEventListener("mouseleave", restore);
  });

  // "report.html#node=NAME" or "#edge=A->B" opens with that element selected (links, screenshots).
  var m = /^#(node|edge)=(.+)$/.exec(decodeURIComponent(location.hash));
  if (m) {
    var ends = m[2].split("->");
    svg.querySelectorAll(m[1] === "node" ? ".node" : ".edge").forEach(function (el) {
      if (m[1] === "node" ? el.dataset.node === m[2] : el.dataset.from === ends[0] && el.dataset.to === ends[1]) pinned = el;
    });
    restore();
    if (pinned) pinned.scrollIntoView({ block: "nearest", inline: "center" });
  }

  // Fit the graph to the page only while its text stays readable; long graphs scroll instead.
  var box = document.getElementById("graphbox"), fit = document.getElementById("fit");
  function setFit(on) {
    box.classList.toggle("fit", on);
    fit.textContent = on ? "actual size" : "fit to width";
  }
  setFit(box.clientWidth >= 0.7 * svg.width.baseVal.value);
  fit.addEventListener("click", function () { setFit(!box.classList.contains("fit")); });
})();
