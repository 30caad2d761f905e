// Live refresh of the console's pages: every data-refresh seconds the page
// is fetched again and its content replaced, unless the operator paused
// it (button or key p), is typing in a form, or the tab is hidden. A page
// that holds a form (an action, a selection) keeps it: only its parts
// marked data-live are replaced. A page with data-refresh 0 (a preview)
// is never refreshed.
(function () {
  "use strict";
  var period = parseInt(document.body.dataset.refresh, 10) * 1000;
  var pause = document.getElementById("pause");
  var shown = document.getElementById("refreshed");
  var paused = sessionStorage.getItem("outbox-console-paused") === "1";

  function show() {
    pause.setAttribute("aria-pressed", paused ? "true" : "false");
    pause.textContent = paused ? "Resume refresh" : "Pause refresh";
  }
  function toggle() {
    paused = !paused;
    sessionStorage.setItem("outbox-console-paused", paused ? "1" : "0");
    show();
  }
  function typing() {
    var el = document.activeElement;
    return el && (el.tagName === "INPUT" || el.tagName === "SELECT" || el.tagName === "TEXTAREA");
  }
  // inFlight is the refresh not answered yet: the next is skipped until
  // it is, so that a slow database is never sent one read on another.
  var inFlight = false;
  function refresh() {
    if (inFlight) { return; }
    inFlight = true;
    fetch(location.href, { headers: { Accept: "text/html" }, credentials: "same-origin" })
      .then(function (r) { return r.text(); })
      .then(function (html) {
        var next = new DOMParser().parseFromString(html, "text/html").getElementById("content");
        if (!next) { return; }
        var content = document.getElementById("content");
        if (content.querySelector("form.action, form.select")) {
          // A page that holds a form keeps it, and what is typed or
          // selected in it: only its live numbers are replaced.
          content.querySelectorAll("[data-live]").forEach(function (el) {
            var fresh = next.querySelector('[data-live="' + el.dataset.live + '"]');
            if (fresh) { el.replaceWith(fresh); }
          });
        } else {
          content.replaceWith(next);
        }
        shown.textContent = "refreshed " + new Date().toLocaleTimeString();
        chart();
      })
      .catch(function () { shown.textContent = "refresh failed; retrying"; })
      .finally(function () { inFlight = false; });
  }
  // chart draws the overview's publish chart from its own request, so
  // that the page never waits for the count of the hour's publishes.
  function chart() {
    var svg = document.getElementById("chart");
    if (!svg) { return; }
    fetch(svg.dataset.src, { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (d) {
        var note = document.getElementById("chart-note");
        if (note) { note.hidden = !d.unavailable; note.textContent = d.unavailable || ""; }
        var counts = d.publishedPerMinute || [];
        var top = Math.max.apply(null, [1].concat(counts));
        var ns = "http://www.w3.org/2000/svg";
        while (svg.firstChild) { svg.removeChild(svg.firstChild); }
        counts.forEach(function (n, i) {
          var h = Math.floor(n * 60 / top);
          if (n > 0) { h = Math.max(h, 1); }
          var rect = document.createElementNS(ns, "rect");
          rect.setAttribute("x", i * 5);
          rect.setAttribute("y", 60 - h);
          rect.setAttribute("width", 4);
          rect.setAttribute("height", h);
          var title = document.createElementNS(ns, "title");
          title.textContent = n + " published " + (counts.length - 1 - i) + " min ago";
          rect.appendChild(title);
          svg.appendChild(rect);
        });
      })
      .catch(function () { svg.setAttribute("aria-label", "The publish chart could not be read"); });
  }
  pause.addEventListener("click", toggle);
  // The outbox selector opens the outbox chosen at once; without
  // script, its button does.
  var outbox = document.getElementById("outbox-select");
  if (outbox) {
    outbox.addEventListener("change", function () { outbox.form.submit(); });
  }
  document.addEventListener("keydown", function (e) {
    if (typing() || e.ctrlKey || e.metaKey || e.altKey) { return; }
    var pages = { "1": 1, "2": 2, "3": 3, "4": 4, "5": 5 };
    if (e.key === "p") { toggle(); }
    else if (e.key === "r") { refresh(); }
    else if (e.key in pages) {
      var nav = document.querySelectorAll("nav a")[parseInt(e.key, 10) - 1];
      if (nav) { location.href = nav.href; }
    }
  });
  show();
  chart();
  if (period > 0) {
    setInterval(function () {
      if (!paused && !document.hidden && !typing()) { refresh(); }
    }, period);
  }
})();
