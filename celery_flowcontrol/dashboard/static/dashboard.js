// flowcontrol dashboard: refresh pages in place and draw the charts. No framework, no build.
// Fresh figures come as server-rendered (autoescaped) HTML parsed with DOMParser, whose scripts
// never run, or as JSON written with textContent/setAttribute only: a label can't become code.
"use strict";

(function () {
  const body = document.body;
  const every = Math.max(0.5, parseFloat(body.dataset.every || "2")) * 1000;
  const SVG = "http://www.w3.org/2000/svg";

  async function fetchPage() {
    const r = await fetch(location.pathname, { headers: { Accept: "text/html" }, credentials: "same-origin" });
    if (!r.ok) throw new Error("HTTP " + r.status);
    return new DOMParser().parseFromString(await r.text(), "text/html");
  }

  // Replace each element matching a selector with its fresh copy from the server.
  function swap(doc, selectors) {
    for (const sel of selectors) {
      const fresh = doc.querySelector(sel);
      const old = document.querySelector(sel);
      if (fresh && old) old.replaceWith(document.importNode(fresh, true));
    }
  }

  function loop(fn, period) {
    const tick = async () => {
      try { await fn(); body.classList.remove("stale"); } catch (e) { body.classList.add("stale"); }
      setTimeout(tick, period);
    };
    setTimeout(tick, period);
  }

  // -- charts -------------------------------------------------------------------------------
  function path(ts, ys, t0, t1, ymax) {
    let d = "", pen = false;
    for (let i = 0; i < ts.length; i++) {
      const y = ys[i];
      if (y === null || y === undefined) { pen = false; continue; }
      const px = ((ts[i] - t0) / Math.max(t1 - t0, 1)) * 296 + 2;
      const py = 76 - (y / ymax) * 70;
      d += (pen ? "L" : "M") + px.toFixed(1) + " " + py.toFixed(1);
      pen = true;
    }
    return d;
  }

  function draw(svg, series, keys) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const ts = series.t || [];
    const now = ts.length ? ts[ts.length - 1] : Date.now() / 1000;
    // The x axis spans the history there is, up to 15 minutes: a young dashboard fills it too.
    const t0 = ts.length > 1 ? Math.max(now - 900, ts[0]) : now - 900;
    let ymax = 0;
    for (const k of keys) for (const v of series[k] || []) if (v !== null && v > ymax) ymax = v;
    ymax = ymax > 0 ? ymax * 1.1 : 1;
    const axis = document.createElementNS(SVG, "text");
    axis.setAttribute("x", "2"); axis.setAttribute("y", "10"); axis.setAttribute("class", "axis");
    axis.textContent = ymax.toPrecision(2);
    svg.appendChild(axis);
    const span = document.createElementNS(SVG, "text");
    span.setAttribute("x", "298"); span.setAttribute("y", "10"); span.setAttribute("class", "axis");
    span.setAttribute("text-anchor", "end");
    span.textContent = "last " + (now - t0 >= 120 ? Math.round((now - t0) / 60) + " min" : Math.round(now - t0) + " s");
    svg.appendChild(span);
    for (const k of keys) {
      const p = document.createElementNS(SVG, "path");
      p.setAttribute("d", path(ts, series[k] || [], t0, now, ymax));
      p.setAttribute("class", "line " + k);
      svg.appendChild(p);
    }
    svg.dataset.points = String(ts.length);
  }

  function last(series, key) {
    const v = (series[key] || []).filter((x) => x !== null);
    return v.length ? v[v.length - 1] : null;
  }

  function card(name) {
    let c = document.querySelector('#charts [data-queue="' + CSS.escape(name) + '"]');
    if (c) return c;
    // A queue registered after the page loaded: build its card (text via textContent only).
    c = document.createElement("section");
    c.className = "chart-card"; c.dataset.queue = name;
    const h = document.createElement("h3"); h.textContent = name; c.appendChild(h);
    for (const kind of ["rates", "waits"]) {
      const fig = document.createElement("figure");
      const svg = document.createElementNS(SVG, "svg");
      svg.setAttribute("class", "chart"); svg.setAttribute("viewBox", "0 0 300 80");
      svg.dataset.chart = kind; fig.appendChild(svg);
      const cap = document.createElement("figcaption");
      const span = document.createElement("span"); span.className = "last"; span.dataset.last = kind;
      cap.appendChild(span); fig.appendChild(cap); c.appendChild(fig);
    }
    document.getElementById("charts").appendChild(c);
    return c;
  }

  function fmt(v, unit) { return v === null ? "-" : (Math.round(v * 100) / 100) + unit; }

  async function refreshCharts() {
    const r = await fetch("/api/queues", { headers: { Accept: "application/json" } });
    if (!r.ok) throw new Error("HTTP " + r.status);
    const data = await r.json();
    const err = document.getElementById("sampling-error");
    if (err) { err.hidden = !data.sampling_error; err.textContent = data.sampling_error ? "Sampling failed: " + data.sampling_error : ""; }
    for (const [name, s] of Object.entries(data.series)) {
      const c = card(name);
      draw(c.querySelector('[data-chart="rates"]'), s, ["admitted", "denied"]);
      draw(c.querySelector('[data-chart="waits"]'), s, ["p50", "p95"]);
      c.querySelector('[data-last="rates"]').textContent = "now " + fmt(last(s, "admitted"), "/s") + " in, " + fmt(last(s, "denied"), "/s") + " denied";
      c.querySelector('[data-last="waits"]').textContent = "last p95 " + fmt(last(s, "p95"), " s");
    }
  }

  // -- pages ---------------------------------------------------------------------------------
  const page = body.dataset.page;
  if (page === "queues") {
    loop(async () => { swap(await fetchPage(), ["#queues tbody"]); }, every);
    refreshCharts().catch(() => body.classList.add("stale"));
    loop(refreshCharts, every);
  } else if (page === "queue") {
    // Tables and figures only: the edit forms are left alone while someone types in them.
    loop(async () => {
      swap(await fetchPage(), ["#figures", "#slots tbody", "#waiters tbody", "#parked tbody",
        '[data-count="slots"]', '[data-count="waiters"]', '[data-count="parked"]']);
    }, every);
  } else if (page === "tenants") {
    loop(async () => {
      swap(await fetchPage(), ["#figures", "#key-chart", "#keys tbody", '[data-count="keys"]']);
    }, every);
  } else if (page === "workers") {
    loop(async () => { swap(await fetchPage(), ["#workers"]); }, Math.max(every, 5000));
  }
})();
