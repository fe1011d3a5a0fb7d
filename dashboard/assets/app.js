// The leapflow dashboard: the whole table once, then each second's changes
// over Server-Sent Events; sparklines of the last minute; charts of the
// selected resource on a time axis; the per-key rules' busiest keys.
// Names and keys are set as text only.
"use strict";
(function () {
  const token = new URLSearchParams(location.search).get("token");
  const api = (path, params) => {
    const q = new URLSearchParams(params || {});
    if (token) q.set("token", token);
    const s = q.toString();
    return "api/" + path + (s ? "?" + s : "");
  };
  const $ = (id) => document.getElementById(id);
  const body = document.querySelector("#resources tbody");
  const SVG = "http://www.w3.org/2000/svg";
  const pageSize = 50;
  const sparkSeconds = 60;

  // The model: each resource's latest row, and its seconds of the last
  // minute (second's Unix ms -> [pass, block]).
  const rows = new Map();
  const seconds = new Map();
  let sparkEnd = 0;
  let selected = null;
  let points = []; // the selected resource's history
  let page = 0;
  let filter = "";

  const fmt = (v) => (v === 0 ? "0" : v < 10 ? v.toFixed(2) : v.toFixed(1));
  const hms = (ms) => new Date(ms).toLocaleTimeString([], { hour12: false });
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const svg = (tag, attrs) => {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  };

  function apply(tick) {
    if (tick.full) {
      rows.clear();
      seconds.clear();
      for (const r of tick.rows) {
        rows.set(r.resource, r);
        const m = new Map();
        if (r.spark) {
          r.spark.pass.forEach((p, i) => {
            const b = r.spark.block[i];
            if (p || b) m.set(tick.sparkEnd - (sparkSeconds - 1 - i) * 1000, [p, b]);
          });
        }
        seconds.set(r.resource, m);
        delete r.spark;
      }
      renderKeys(tick.keys || []);
    } else {
      for (const r of tick.rows) {
        rows.set(r.resource, r);
        let m = seconds.get(r.resource);
        if (!m) seconds.set(r.resource, (m = new Map()));
        for (const p of r.new || []) {
          m.set(p.t, [p.pass, p.block]);
          if (r.resource === selected && (points.length === 0 || points[points.length - 1].t < p.t)) points.push(p);
        }
        delete r.new;
      }
      // A row gone keeps its seconds: it may come back (pruned by time).
      for (const g of tick.gone || []) rows.delete(g);
      if (tick.keys) renderKeys(tick.keys);
    }
    if (tick.reload) renderReload(tick.reload);
    sparkEnd = Math.max(sparkEnd, tick.sparkEnd || 0);
    for (const [res, m] of seconds) {
      for (const t of m.keys()) if (t <= sparkEnd - sparkSeconds * 1000) m.delete(t);
      if (m.size === 0 && !rows.has(res)) seconds.delete(res);
    }
    $("clock").textContent = hms(tick.t);
    render();
    if (selected) draw();
  }

  function sparkline(resource) {
    const w = 120, h = 24;
    const s = svg("svg", { class: "spark", viewBox: `0 0 ${w} ${h}`, "aria-label": "pass and block over the last minute" });
    const m = seconds.get(resource) || new Map();
    const series = [[], []];
    let top = 1;
    for (let i = 0; i < sparkSeconds; i++) {
      const v = m.get(sparkEnd - (sparkSeconds - 1 - i) * 1000) || [0, 0];
      series[0].push(v[0]);
      series[1].push(v[1]);
      top = Math.max(top, v[0], v[1]);
    }
    ["series-pass", "series-block"].forEach((cls, k) => {
      const pts = series[k].map((v, i) => `${((i * (w - 2)) / (sparkSeconds - 1) + 1).toFixed(1)},${(h - 2 - ((h - 4) * v) / top).toFixed(1)}`);
      s.appendChild(svg("polyline", { class: cls, points: pts.join(" ") }));
    });
    return s;
  }

  function badge(name, cls, text, title) {
    const b = el("span", "badge " + cls, text);
    b.title = title;
    name.appendChild(b);
  }

  function render() {
    const q = filter.toLowerCase();
    const shown = [...rows.values()].filter((r) => !q || r.resource.toLowerCase().includes(q));
    shown.sort((a, b) => b.pass + b.block - (a.pass + a.block) || (a.resource < b.resource ? -1 : a.resource > b.resource ? 1 : 0));
    const pages = Math.max(1, Math.ceil(shown.length / pageSize));
    page = Math.min(page, pages - 1);
    $("page").textContent = `page ${page + 1} of ${pages}`;
    $("prev").disabled = page === 0;
    $("next").disabled = page >= pages - 1;
    $("count").textContent = q ? `${shown.length} of ${rows.size} resources` : `${rows.size} resources`;
    const frag = document.createDocumentFragment();
    for (const r of shown.slice(page * pageSize, (page + 1) * pageSize)) {
      const tr = el("tr", r.resource === selected ? "selected" : "");
      tr.dataset.resource = r.resource;
      const name = el("td", "name", r.resource);
      tr.appendChild(name);
      if (r.unreached) {
        badge(name, "unreached", "no traffic",
          "This resource's rules cannot take effect as named: it sees no request while requests go unmatched. Check the names your router gives.");
      }
      if (r.breaker) {
        const since = r.breakerSince ? " since " + hms(r.breakerSince) : "";
        badge(name, "breaker " + r.breaker, "breaker " + r.breaker + since,
          r.breaker === "closed"
            ? "Its circuit breaker admits requests and counts their outcomes."
            : r.breaker === "open"
              ? "Its circuit breaker refuses every request; next probe in " + fmt((r.breakerRetryMs || 0) / 1000) + " s."
              : "Its circuit breaker has let one probe through and refuses the rest until it decides.");
      }
      if (r.system) {
        const sys = r.system;
        badge(name, "system" + (sys.refusing ? " refusing" : sys.shedding ? " shedding" : ""),
          "CPU " + Math.round(sys.cpu * 100) + "% · limit " + sys.limit,
          "Its system rules read a CPU usage of " + Math.round(sys.cpu * 100) + "%; the BBR estimate of how many requests may be in flight is " +
            sys.limit + ". " +
            (sys.refusing ? "They refuse requests now." : sys.shedding ? "Its SystemBBR rule checks every request (the CPU is hot, or was in the last second)." : "They admit every request."));
      }
      const sp = el("td", "spark");
      sp.appendChild(sparkline(r.resource));
      tr.appendChild(sp);
      tr.appendChild(el("td", "pass", String(r.pass)));
      tr.appendChild(el("td", "block" + (r.block > 0 ? " hot" : ""), String(r.block)));
      tr.appendChild(el("td", "success", String(r.success)));
      tr.appendChild(el("td", "exception" + (r.exception > 0 ? " hot" : ""), String(r.exception)));
      tr.appendChild(el("td", "avgrt", fmt(r.avgRT)));
      tr.appendChild(el("td", "minrt", fmt(r.minRT)));
      tr.appendChild(el("td", "inflight", String(r.inflight)));
      tr.appendChild(el("td", "name rules", r.rules));
      tr.addEventListener("click", () => select(r.resource));
      frag.appendChild(tr);
    }
    body.replaceChildren(frag);
  }

  function renderReload(r) {
    const s = $("reload");
    s.hidden = false;
    s.className = "reload" + (r.error ? " failed" : "");
    s.textContent = r.error
      ? "rules not reloaded: " + r.error
      : "rules reloaded " + r.count + (r.count === 1 ? " time" : " times") + (r.at ? ", last at " + hms(r.at) : "");
    s.title = r.error ? "The rules in force are older than the source." : "";
  }

  function renderKeys(keys) {
    $("keys-panel").hidden = keys.length === 0;
    const frag = document.createDocumentFragment();
    for (const k of keys) {
      const box = el("div", "keyrule");
      box.dataset.rule = k.rule;
      box.appendChild(el("h3", "", `${k.resource} · ${k.rule}`));
      box.appendChild(el("p", "muted", `${k.tracked} of ${k.capacity} keys tracked · ${k.evictions} evicted while active`));
      const tables = el("div", "tables");
      for (const [title, list, cls] of [["most admitted", k.passed, "passed"], ["most refused", k.refused, "refused"]]) {
        const t = el("table", "keys " + cls);
        const head = el("tr");
        head.appendChild(el("th", "name", title));
        head.appendChild(el("th", "", "requests"));
        t.appendChild(head);
        if (list.length === 0) {
          const tr = el("tr");
          tr.appendChild(el("td", "key muted", "none sampled"));
          tr.appendChild(el("td", "", ""));
          t.appendChild(tr);
        }
        for (const c of list) {
          const tr = el("tr");
          tr.appendChild(el("td", "key", c.key));
          tr.appendChild(el("td", "count", "~" + c.count));
          t.appendChild(tr);
        }
        tables.appendChild(t);
      }
      box.appendChild(tables);
      frag.appendChild(box);
    }
    $("keys").replaceChildren(frag);
  }

  function select(resource) {
    selected = resource;
    points = []; // a change's seconds of it, until its history comes
    $("chart-title").textContent = resource;
    $("chart-panel").hidden = false;
    for (const tr of body.children) tr.className = tr.dataset.resource === resource ? "selected" : "";
    fetch(api("history", { resource })).then((r) => r.json()).then((ps) => {
      if (selected !== resource) return;
      const last = ps.length ? ps[ps.length - 1].t : 0;
      points = ps.concat(points.filter((p) => p.t > last));
      draw();
    });
  }

  // chart draws series of points on a time axis: wall-clock labels below,
  // the unit and the scale on the left, from the first point to the last.
  function chart(node, series, unit, zeroFill) {
    const w = 900, h = 220, left = 56, right = 10, top = 18, bottom = 26;
    // From the first point to the last: the data fills the chart (ten
    // seconds at least).
    const t1 = points.length ? points[points.length - 1].t : Date.now();
    const t0 = Math.min(points.length ? points[0].t : t1, t1 - 10 * 1000);
    let max = 0;
    for (const p of points) for (const [key] of series) max = Math.max(max, p[key]);
    const scale = niceMax(max);
    const x = (t) => left + ((w - left - right) * (t - t0)) / Math.max(t1 - t0, 1);
    const y = (v) => h - bottom - ((h - top - bottom) * v) / scale;
    const parts = [];
    for (let i = 0; i <= 4; i++) {
      const v = (scale * i) / 4;
      parts.push(svg("line", { class: "grid", x1: left, x2: w - right, y1: y(v), y2: y(v) }));
      const label = svg("text", { class: "tick y", x: left - 6, y: y(v) + 4, "text-anchor": "end" });
      label.textContent = v >= 100 ? String(Math.round(v)) : String(+v.toFixed(2));
      parts.push(label);
    }
    const unitLabel = svg("text", { class: "unit", x: 4, y: 12 });
    unitLabel.textContent = unit;
    parts.push(unitLabel);
    const step = [5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600].map((s) => s * 1000).find((s) => (t1 - t0) / s <= 8) || 3600 * 1000;
    for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
      parts.push(svg("line", { class: "grid", x1: x(t), x2: x(t), y1: top, y2: h - bottom }));
      if (x(t) > w - right - 26) continue; // its label would be cut at the edge
      const label = svg("text", { class: "tick x", x: x(t), y: h - 8, "text-anchor": "middle" });
      label.textContent = hms(t);
      parts.push(label);
    }
    // Counts: a second with no traffic is not delivered, and is 0. Times:
    // it has none, and its line breaks there.
    const byTime = new Map(points.map((p) => [p.t, p]));
    for (const [key, cls] of series) {
      let run = [];
      const flush = () => {
        if (run.length) parts.push(svg("polyline", { class: cls, "data-series": key, "data-points": String(run.length), points: run.join(" ") }));
        run = [];
      };
      for (let t = points.length ? points[0].t : t1; t <= t1; t += 1000) {
        const p = byTime.get(t);
        if (!p && zeroFill) {
          run.push(`${x(t).toFixed(1)},${y(0).toFixed(1)}`);
        } else if (!p) {
          flush();
        } else {
          run.push(`${x(t).toFixed(1)},${y(p[key]).toFixed(1)}`);
        }
      }
      flush();
    }
    node.replaceChildren(...parts);
  }

  // niceMax is the top of a scale that holds v: 1, 2 or 5 times a power
  // of ten.
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  function draw() {
    const horizon = points.length ? points[points.length - 1].t - 300 * 1000 : 0;
    points = points.filter((p) => p.t > horizon);
    chart($("traffic-chart"), [["pass", "series-pass"], ["block", "series-block"], ["exception", "series-exception"]], "requests/s", true);
    chart($("rt-chart"), [["avgRT", "series-avgrt"], ["minRT", "series-minrt"]], "ms", false);
  }

  $("search").addEventListener("input", (e) => {
    filter = e.target.value;
    page = 0;
    render();
  });
  $("prev").addEventListener("click", () => { page = Math.max(0, page - 1); render(); });
  $("next").addEventListener("click", () => { page++; render(); });
  $("chart-close").addEventListener("click", () => {
    selected = null;
    $("chart-panel").hidden = true;
    render();
  });

  const events = new EventSource(api("events"));
  events.addEventListener("tick", (e) => apply(JSON.parse(e.data)));
  events.onopen = () => { $("status").textContent = "live"; $("status").className = "status live"; };
  events.onerror = () => { $("status").textContent = "reconnecting"; $("status").className = "status"; };
})();
