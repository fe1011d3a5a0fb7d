// The leapflow dashboard: a table fed every second by Server-Sent Events,
// and a chart of the selected resource. Names are set as text only.
"use strict";
(function () {
  const token = new URLSearchParams(location.search).get("token");
  const api = (path, params) => {
    const q = new URLSearchParams(params || {});
    if (token) q.set("token", token);
    const s = q.toString();
    return "api/" + path + (s ? "?" + s : "");
  };
  const body = document.querySelector("#resources tbody");
  const status = document.getElementById("status");
  const clock = document.getElementById("clock");
  const panel = document.getElementById("chart-panel");
  const title = document.getElementById("chart-title");
  const canvas = document.getElementById("chart");
  let selected = null;
  let points = [];
  const horizon = 300 * 1000;

  const fmt = (v) => (v === 0 ? "0" : v < 10 ? v.toFixed(2) : v.toFixed(1));
  const cell = (tr, text, cls) => {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  };

  function render(tick) {
    clock.textContent = new Date(tick.t).toLocaleTimeString();
    const frag = document.createDocumentFragment();
    for (const r of tick.rows) {
      const tr = document.createElement("tr");
      tr.dataset.resource = r.resource;
      if (r.resource === selected) tr.className = "selected";
      const name = cell(tr, r.resource, "name");
      if (r.unreached) {
        const badge = document.createElement("span");
        badge.className = "badge unreached";
        badge.textContent = "no traffic";
        badge.title = "This resource's rules cannot take effect as named: it sees no request while requests go unmatched. Check the names your router gives.";
        name.appendChild(badge);
      }
      if (r.breaker) {
        const badge = document.createElement("span");
        badge.className = "badge breaker " + r.breaker;
        badge.textContent = "breaker " + r.breaker;
        badge.title = r.breaker === "closed"
          ? "Its circuit breaker admits requests and counts their outcomes."
          : r.breaker === "open"
            ? "Its circuit breaker refuses every request; next probe in " + fmt((r.breakerRetryMs || 0) / 1000) + " s."
            : "Its circuit breaker has let one probe through and refuses the rest until it decides.";
        name.appendChild(badge);
      }
      if (r.system) {
        const sys = r.system;
        const badge = document.createElement("span");
        badge.className = "badge system" + (sys.refusing ? " refusing" : sys.shedding ? " shedding" : "");
        badge.textContent = "CPU " + Math.round(sys.cpu * 100) + "% · limit " + sys.limit;
        badge.title = "Its system rules read a CPU usage of " + Math.round(sys.cpu * 100) + "%; the BBR estimate of how many requests may be in flight is " +
          sys.limit + ". " +
          (sys.refusing ? "They refuse requests now." : sys.shedding ? "Its SystemBBR rule checks every request (the CPU is hot, or was in the last second)." : "They admit every request.");
        name.appendChild(badge);
      }
      cell(tr, String(r.pass), "pass");
      cell(tr, String(r.block), "block" + (r.block > 0 ? " hot" : ""));
      cell(tr, String(r.success), "success");
      cell(tr, String(r.exception), "exception" + (r.exception > 0 ? " hot" : ""));
      cell(tr, fmt(r.avgRT), "avgrt");
      cell(tr, fmt(r.minRT), "minrt");
      cell(tr, String(r.inflight), "inflight");
      cell(tr, r.rules, "name rules");
      tr.addEventListener("click", () => select(r.resource));
      frag.appendChild(tr);
      if (r.resource === selected && r.t && (points.length === 0 || points[points.length - 1].t < r.t)) {
        points.push(r);
        draw();
      }
    }
    body.replaceChildren(frag);
  }

  function select(resource) {
    selected = resource;
    title.textContent = resource;
    panel.hidden = false;
    for (const tr of body.children) tr.className = tr.dataset.resource === resource ? "selected" : "";
    fetch(api("history", { resource })).then((r) => r.json()).then((ps) => {
      if (selected !== resource) return;
      points = ps;
      draw();
    });
  }

  function draw() {
    const ctx = canvas.getContext("2d");
    const w = canvas.width, h = canvas.height, pad = 30;
    ctx.clearRect(0, 0, w, h);
    const now = points.length ? points[points.length - 1].t : Date.now();
    points = points.filter((p) => p.t > now - horizon);
    let top = 1;
    for (const p of points) top = Math.max(top, p.pass, p.block, p.exception);
    ctx.strokeStyle = "#e3e6ea";
    ctx.fillStyle = "#5b6571";
    ctx.font = "11px system-ui";
    for (let i = 0; i <= 4; i++) {
      const y = h - pad - ((h - 2 * pad) * i) / 4;
      ctx.beginPath(); ctx.moveTo(pad, y); ctx.lineTo(w - 5, y); ctx.stroke();
      ctx.fillText(String(Math.round((top * i) / 4)), 2, y + 4);
    }
    const x = (t) => pad + ((w - pad - 5) * (t - (now - horizon))) / horizon;
    const y = (v) => h - pad - ((h - 2 * pad) * v) / top;
    for (const [key, color] of [["pass", "#1f7a3a"], ["block", "#b3261e"], ["exception", "#b35c00"]]) {
      ctx.strokeStyle = color;
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      points.forEach((p, i) => (i ? ctx.lineTo(x(p.t), y(p[key])) : ctx.moveTo(x(p.t), y(p[key]))));
      ctx.stroke();
    }
  }

  fetch(api("tick")).then((r) => r.json()).then(render).catch(() => {});
  const events = new EventSource(api("events"));
  events.addEventListener("tick", (e) => render(JSON.parse(e.data)));
  events.onopen = () => { status.textContent = "live"; status.className = "status live"; };
  events.onerror = () => { status.textContent = "reconnecting"; status.className = "status"; };
})();
