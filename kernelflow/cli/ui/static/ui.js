// kernelflow ui: live updates. The server renders every fragment (escaped there); this
// script only swaps the page's live region for the newest one a server-sent event brings,
// keeps open what the reader opened, and counts elapsed times on between updates.
"use strict";
(function () {
  const live = document.getElementById("live");
  const conn = document.getElementById("conn");
  const skew = parseFloat(document.body.dataset.now) * 1000 - Date.now();

  function say(text, cls) {
    conn.textContent = text;
    conn.className = "conn " + cls;
  }

  function tick() {
    const now = (Date.now() + skew) / 1000;
    for (const el of document.querySelectorAll("[data-since]")) {
      const s = Math.max(0, now - parseFloat(el.dataset.since));
      el.textContent = s < 120 ? s.toFixed(1) + " s"
        : Math.floor(s / 60) + " min " + String(Math.floor(s % 60)).padStart(2, "0") + " s";
    }
  }
  setInterval(tick, 1000);

  if (!live || !live.dataset.stream || !window.EventSource) {
    say("", "");
    return;
  }
  const url = live.dataset.stream + (live.dataset.stream.includes("?") ? "&" : "?") +
    "v=" + encodeURIComponent(live.dataset.version);
  const source = new EventSource(url);
  source.onopen = () => say("live", "live");
  source.onerror = () => say("reconnecting…", "down");
  source.addEventListener("problem", (e) => say(e.data, "down"));
  source.onmessage = (e) => {
    const opened = new Set();
    const closed = new Set();
    for (const d of live.querySelectorAll("details[id]")) (d.open ? opened : closed).add(d.id);
    live.innerHTML = e.data;
    for (const d of live.querySelectorAll("details[id]")) {
      if (opened.has(d.id)) d.open = true;
      else if (closed.has(d.id)) d.open = false;
    }
    say("live", "live");
    tick();
  };
})();
