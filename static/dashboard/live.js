// MemoryHub live dashboard (issue 15): keeps a student's page or the school overview up to date
// over a websocket (dashboard/consumers.py). No inline script (the Content-Security-Policy allows
// none): the page declares what it needs with data- attributes.
//
//   <span data-live="stack" data-live-url="/ws/stacks/<slug>/" data-live-seq="<n>"
//         data-live-inserts="yes|no" data-live-page-size="25"><span data-live-state role="status">
//   <span data-live="school" data-live-url="/ws/school/">…
//
// The server renders every row (the page's own row partial) and says whether it still matches the
// page's filters; this script only inserts, replaces or removes elements by id. It reconnects with
// back-off and resumes from the last change it applied (`?since=<seq>`), so a change made while the
// socket was down still appears; an event applied once is never applied again. The server keeps
// `seq` gap-free (every event at or below it was sent, even one published late: dashboard/live.py
// changes_through), which is what makes it a safe resume point.
(function () {
  "use strict";

  var root = document.querySelector("[data-live]");
  if (!root || !("WebSocket" in window)) return;
  var mode = root.getAttribute("data-live");
  var path = root.getAttribute("data-live-url");
  var state = root.querySelector("[data-live-state]");
  var seq = parseInt(root.getAttribute("data-live-seq") || "0", 10) || 0;
  var inserts = root.getAttribute("data-live-inserts") === "yes";
  var pageSize = parseInt(root.getAttribute("data-live-page-size") || "25", 10) || 25;
  // Closed on purpose by the server: reconnecting would not help (dashboard/live.py close codes).
  var FINAL = { 4401: "Offline: signed out", 4403: "Offline: no access any more" };
  var MAX_DELAY_MS = 30000;
  var applied = [];  // ids of the events already applied (the newest 500)
  var socket = null;
  var timer = null;
  var attempts = 0;
  var hidden = 0;  // changes this page could not show (filtered, searched or a later page)

  function show(status, badge, text) {
    root.setAttribute("data-live-status", status);
    if (!state) return;
    state.className = "badge " + badge;
    state.textContent = text;
  }

  function socketUrl() {
    var query = new URLSearchParams(window.location.search);
    query.delete("since");
    if (mode === "stack") query.set("since", String(seq));
    var text = query.toString();
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    return scheme + window.location.host + path + (text ? "?" + text : "");
  }

  function connect() {
    timer = null;
    socket = new WebSocket(socketUrl());
    socket.addEventListener("open", function () {
      attempts = 0;
      show("connected", "ok", "Live");
    });
    socket.addEventListener("message", function (event) {
      var message;
      try { message = JSON.parse(event.data); } catch (error) { return; }
      handle(message);
    });
    socket.addEventListener("close", function (event) {
      socket = null;
      if (FINAL[event.code]) {
        show("offline", "danger", FINAL[event.code]);
        return;
      }
      retry();
    });
  }

  function retry() {
    attempts += 1;
    // 0.5 s, 1 s, 2 s … up to 30 s, with jitter so a restarted server is not hit by every page at once.
    var delay = Math.min(MAX_DELAY_MS, 500 * Math.pow(2, attempts - 1)) * (0.75 + Math.random() * 0.5);
    if (attempts > 4) show("offline", "danger", "Offline: retrying");
    else show("reconnecting", "warn", "Reconnecting…");
    timer = window.setTimeout(connect, delay);
  }

  window.addEventListener("online", function () {
    if (timer !== null) {
      window.clearTimeout(timer);
      connect();
    }
  });

  function handle(message) {
    if (message.type === "overview") overview(message);
    else if (message.type === "change") change(message);
    else if (message.type === "reload") banner("Many changes were made while this page was offline.");
  }

  // --- the student page ---

  function change(message) {
    var fresh = (message.events || []).filter(function (id) { return applied.indexOf(id) < 0; });
    if (!fresh.length) return;  // already applied (a resume overlaps the live stream)
    applied = applied.concat(fresh).slice(-500);
    seq = Math.max(seq, message.seq || 0);
    root.setAttribute("data-live-seq", String(seq));
    var list = document.querySelector("[data-live-list]");
    (message.rows || []).forEach(function (row) { list = applyRow(row, list); });
    (message.removed || []).forEach(function (id) {
      var element = document.getElementById("memory-" + id);
      if (element && list && list.contains(element)) element.remove();
      else if (element) hidden += 1;
    });
    hidden += message.unresolved || 0;
    if (message.counts) counts(message.counts, message.total);
    if (message.figures) figures(message.figures);
    if ((message.rows || []).length || (message.removed || []).length || message.unresolved) stale();
    if (message.checkpoint) replace("live-checkpoint", message.checkpoint);
    if (message.boot_config) replace("live-boot-config", message.boot_config);
    if (hidden) banner(hidden + (hidden === 1 ? " change" : " changes") + " not shown here.");
  }

  function fragment(html) {
    var template = document.createElement("template");
    template.innerHTML = html.trim();
    return template.content.firstElementChild;
  }

  // Shows one row on the page; returns the list (created for the page's first memory).
  function applyRow(row, list) {
    var existing = document.getElementById("memory-" + row.id);
    if (existing && list && list.contains(existing)) {
      if (row.matches) existing.replaceWith(fragment(row.html));
      else existing.remove();  // e.g. forgotten while the page hides forgotten memories
      return list;
    }
    if (!row.matches) return list;
    if (!inserts || existing) {  // a search or a later page: the list is not the newest first
      hidden += 1;
      return list;
    }
    if (!list) list = createList();
    if (!list) {
      hidden += 1;
      return list;
    }
    var created = Date.parse(row.created);
    var before = null;
    for (var i = 0; i < list.children.length; i += 1) {
      var other = Date.parse(list.children[i].getAttribute("data-created") || "");
      if (!(other > created)) { before = list.children[i]; break; }
    }
    if (before === null && list.children.length >= pageSize) return list;  // belongs on a later page
    var element = fragment(row.html);
    element.classList.add("live-new");
    list.insertBefore(element, before);
    while (list.children.length > pageSize) list.lastElementChild.remove();
    return list;
  }

  function createList() {
    var empty = document.querySelector("[data-live-empty]");
    if (!empty) return null;
    var list = document.createElement("ol");
    list.className = "memory-list";
    list.setAttribute("aria-label", "Memories, newest first");
    list.setAttribute("data-live-list", "");
    empty.replaceWith(list);
    return list;
  }

  function counts(byKind, total) {
    document.querySelectorAll("[data-live-count]").forEach(function (element) {
      var kind = element.getAttribute("data-live-count");
      var value = kind ? byKind[kind] : total;
      var count = element.querySelector(".muted");
      if (value !== undefined && count) count.textContent = "(" + value + ")";
    });
  }

  function setTime(element, when) {
    element.textContent = "";
    if (!when) {
      element.textContent = "never";
      return;
    }
    var time = document.createElement("time");
    time.setAttribute("datetime", when.iso);
    time.textContent = when.text;
    element.appendChild(time);
  }

  function figures(values) {
    document.querySelectorAll("[data-live-figure]").forEach(function (element) {
      var name = element.getAttribute("data-live-figure");
      if (!(name in values)) return;
      if (name === "last_sync" || name === "last_write") setTime(element, values[name]);
      else element.textContent = values[name];
    });
  }

  function replace(id, html) {
    var element = document.getElementById(id);
    if (element) element.replaceWith(fragment(html));
  }

  // The storage and forgetting cards are drawn once, when the page loads: once memories change,
  // say that they are older than the list and the header figures above them.
  function stale() {
    document.querySelectorAll("[data-live-stale]").forEach(function (element) { element.hidden = false; });
  }

  function banner(text) {
    var element = document.querySelector("[data-live-banner]");
    if (!element) return;
    element.querySelector("[data-live-banner-text]").textContent = text;
    element.hidden = false;
  }

  // --- the school overview ---

  function overview(message) {
    figures(message.summary || {});
    (message.stacks || []).forEach(function (stack) {
      var row = document.querySelector('tr[data-stack="' + CSS.escape(stack.slug) + '"]');
      if (!row) return;  // not on this page of the table
      row.querySelectorAll("[data-live-cell]").forEach(function (cell) {
        var name = cell.getAttribute("data-live-cell");
        if (!(name in stack)) return;
        if (name === "last_sync" || name === "last_write") setTime(cell, stack[name]);
        else cell.textContent = stack[name];
      });
    });
  }

  // For tests and bench/live.py: the socket in use, and a way to drop it as a network failure would.
  window.MemoryHubLive = {
    seq: function () { return seq; },
    drop: function () { if (socket) socket.close(); }
  };

  show("connecting", "", "Live: connecting…");
  connect();
})();
