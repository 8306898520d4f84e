// The pages of `launch.py serve`, built from the server's JSON. Every text goes in with textContent: what a program
// wrote (a log line, a run's name) is shown as text, never read as HTML.
"use strict";

const REFRESH_MS = 3000; // how often an open page asks again

const $ = (id) => document.getElementById(id);

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

async function ask(path, options = {}) {
  const answer = await fetch(path, { credentials: "same-origin", ...options });
  const json = (answer.headers.get("Content-Type") || "").startsWith("application/json");
  const body = json ? await answer.json() : { error: await answer.text() };
  if (!answer.ok) throw new Error(body.error || answer.statusText);
  return body;
}

function fixed(value, digits) {
  return value === null || value === undefined ? "" : Number(value).toFixed(digits);
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "";
  const s = Math.round(seconds);
  return s >= 3600 ? `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`
    : s >= 60 ? `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s` : `${s}s`;
}

function every(tick) {
  // tick() now and every REFRESH_MS; the function that asks again at once (after a click)
  const run = async () => {
    try {
      await tick();
      $("problem").textContent = "";
    } catch (err) {
      $("problem").textContent = err.message;
    }
  };
  run();
  setInterval(run, REFRESH_MS);
  return run;
}

// ---------------------------------------------------------------------------------------------------------------
// the sweeps of the work directory

function sweepsPage() {
  every(async () => {
    const doc = await ask("/api/sweeps");
    $("where").textContent = doc.workdir;
    $("sweeps").tBodies[0].replaceChildren(...doc.sweeps.map((e) => {
      const link = el("a", e.sweep);
      link.href = `/sweep/${encodeURIComponent(e.sweep)}`;
      const first = el("td");
      first.append(link);
      const states = e.problem ? `cannot be read: ${e.problem}`
        : Object.entries(e.states || {}).map(([state, n]) => `${n} ${state}`).join(", ");
      const row = el("tr");
      row.append(first, el("td", e.cluster), el("td", e.runs, "num"), el("td", states),
        el("td", e.changed ? new Date(e.changed * 1000).toLocaleString() : ""));
      return row;
    }));
  });
}

// ---------------------------------------------------------------------------------------------------------------
// one sweep: its runs, their curves, a run's log

const view = { name: decodeURIComponent(location.pathname.split("/")[2] || ""), run: null, metric: null,
  plot: null, plotted: "", shown: null, page: 0, again: null, attention: "" };

function sweepPage() {
  $("name").textContent = view.name;
  document.title = `sweep ${view.name}`;
  $("cancel").addEventListener("click", cancel);
  $("resubmit").addEventListener("click", resubmit);
  $("cancel-run").addEventListener("click", cancelRun);
  $("previous").addEventListener("click", () => turn(-1));
  $("next").addEventListener("click", () => turn(1));
  view.again = every(refresh);
  $("metric").addEventListener("change", () => { view.metric = $("metric").value; view.again(); });
}

async function refresh() {
  // one question a refresh, answered in the size of a page: the page's runs, the counts, the curves drawn
  const base = `/api/sweeps/${encodeURIComponent(view.name)}`;
  const query = new URLSearchParams({ page: view.page });
  if (view.metric) query.set("metric", view.metric);
  if (view.run !== null) query.set("run", view.run);
  const shown = await ask(`${base}/view?${query}`);
  view.shown = shown;
  view.page = shown.page;
  showStatus(shown);
  showTrials(shown);
  showMetrics(shown);
  showCurves(Object.keys(shown.curves), shown.curves);
  if (view.run !== null) await showRun(base, shown.run);
}

function turn(by) {
  view.page = Math.min(view.shown.pages - 1, Math.max(0, view.page + by));
  view.again();
}

function showStatus(shown) {
  const status = shown.status;
  $("counts").textContent = `${shown.total} run(s): ` + Object.entries(status.counts)
    .map(([state, n]) => `${n} ${state}`).join(", ") + (status.unheard.length ? ` (not heard: ${status.unheard.join("; ")})` : "");
  $("notes").replaceChildren(...[...status.retry, ...status.queue].map((line) => el("li", line)));
  const first = shown.page * shown.per_page;
  $("pages").textContent = `runs ${Math.min(first + 1, shown.total)}-${first + status.runs.length} of ${shown.total}`;
  $("runs").tBodies[0].replaceChildren(...status.runs.map((r) => {
    const row = el("tr");
    row.dataset.run = r.name;
    row.append(el("td", r.name), el("td", r.state, `state-${r.state_name}`), el("td", r.round, "num"),
      el("td", r.restarts, "num"), el("td", r.max_steps ? `${r.step ?? 0}/${r.max_steps}` : r.step, "num"),
      el("td", fixed(r.train_loss, 4), "num"), el("td", fixed(r.val_loss, 4), "num"), el("td", duration(r.eta_s)),
      el("td", r.nodes));
    row.addEventListener("click", () => { view.run = r.name; $("run").hidden = false; view.again(); });
    return row;
  }));
}

function showTrials(shown) {
  // an Optuna search's trials, the best first (the answer holds a page of them)
  const trials = shown.status.trials;
  $("trials").hidden = trials === null;
  if (trials === null) return;
  $("trials-title").textContent = `trials: the best ${trials.length} of ${shown.trials}`;
  $("trials").querySelector("tbody").replaceChildren(...trials.map((t) => {
    const row = el("tr");
    row.append(el("td", t.trial, "num"), el("td", t.state), el("td", fixed(t.value, 4), "num"),
      el("td", t.pruned_at, "num"), el("td", t.worker, "num"),
      el("td", Object.entries(t.params).map(([k, v]) => `${k}=${v}`).join(", ")));
    return row;
  }));
}

function showMetrics(shown) {
  view.metric = shown.metric;
  $("metric").replaceChildren(...shown.metrics.map((n) => { const o = el("option", n); o.value = n; return o; }));
  $("metric").value = view.metric || "";
}

function showCurves(runs, curves) {
  const points = (r) => curves[r] || [];
  const steps = [...new Set(runs.flatMap((r) => points(r).map((p) => p[0])))].sort((a, b) => a - b);
  const data = [steps, ...runs.map((r) => {
    const at = new Map(points(r));
    return steps.map((s) => (at.has(s) ? at.get(s) : null));
  })];
  const chart = $("chart");
  chart.dataset.points = String(runs.reduce((n, r) => n + points(r).length, 0));
  chart.dataset.runs = runs.join("\n");
  const key = `${view.metric}|${runs.join("\n")}`;
  if (view.plot && view.plotted === key) {
    view.plot.setData(data);
    return;
  }
  if (view.plot) view.plot.destroy();
  view.plotted = key;
  view.plot = new uPlot({ width: Math.min(900, window.innerWidth - 60), height: 320, spanGaps: true,
    scales: { x: { time: false } }, axes: [{ label: "step" }, { label: view.metric || "" }],
    series: [{ label: "step" }, ...runs.map((r, i) => ({ label: r, stroke: `hsl(${(i * 137) % 360} 65% 45%)` }))],
  }, data, chart);
}

async function showRun(base, row) {
  // the run's row (from the view), then what its page adds: logs, samples, attention maps, its use of Slurm's
  $("run-name").textContent = `run ${view.run}: ${row ? row.state : ""}`;
  $("run-error").textContent = row && row.error ? row.error : "";
  $("run-retry").textContent = row && row.retry ? `retry: ${row.retry}` : "";
  const run = await ask(`${base}/runs/${encodeURIComponent(view.run)}`);
  $("run-log").textContent = run.logs.length ? run.logs.map((l) => `==> job ${l.job}: ${l.path} <==\n${l.text}`).join("\n")
    : "(never submitted to Slurm)";
  showEfficiency(run.efficiency);
  $("run-samples-part").hidden = run.samples === null;
  $("run-samples").textContent = run.samples || "";
  showAttention(run.attention);
  $("run-problems").textContent = run.problems.join("\n");
}

function showEfficiency(row) {
  // how its latest job used its allocation: `status --efficiency`'s row, its columns as headers
  const table = $("run-efficiency");
  table.hidden = !row;
  if (!row) return;
  const head = el("tr");
  const cells = el("tr");
  for (const [column, value] of Object.entries(row)) {
    head.append(el("th", column));
    cells.append(el("td", value));
  }
  table.replaceChildren(head, cells);
}

function showAttention(maps) {
  // drawn again only when they change (a run writes them as it ends): one square a head, the prompt along both sides
  $("run-attention-part").hidden = !maps;
  const key = maps ? `${view.run}|${maps.step}` : "";
  if (!maps || view.attention === key) return;
  view.attention = key;
  const select = $("run-layer");
  select.replaceChildren(...maps.layers.map((_, i) => { const o = el("option", i); o.value = String(i); return o; }));
  select.onchange = () => drawHeads(maps, Number(select.value));
  drawHeads(maps, 0);
}

function drawHeads(maps, layer) {
  const n = maps.prompt.length;
  const cell = 14;
  const margin = 16;
  const labels = maps.prompt.map((ch) => (ch === " " ? "\u2423" : ch.trim() ? ch : "\u21b5"));
  $("run-attention-title").textContent = `attention of layer ${layer} at step ${maps.step}: each row a character `
    + "of the prompt, along it the characters it attends to";
  $("run-attention").replaceChildren(...maps.layers[layer].map((head, h) => {
    const canvas = el("canvas");
    canvas.width = canvas.height = margin + n * cell;
    const g = canvas.getContext("2d");
    g.font = "10px monospace";
    g.textAlign = "center";
    g.textBaseline = "middle";
    labels.forEach((label, i) => {
      g.fillText(label, margin + i * cell + cell / 2, margin / 2);
      g.fillText(label, margin / 2, margin + i * cell + cell / 2);
    });
    head.forEach((weights, q) => weights.forEach((w, k) => {
      g.fillStyle = `hsl(${250 - 190 * w} 80% ${20 + 50 * w}%)`;
      g.fillRect(margin + k * cell, margin + q * cell, cell, cell);
    }));
    const figure = el("figure");
    figure.append(canvas, el("figcaption", `head ${h}`));
    return figure;
  }));
}

async function cancel() {
  if (!window.confirm(`Cancel every run of sweep ${view.name}? Slurm stops them now; resubmit sends them again.`)) return;
  const done = await act("cancel");
  if (done) $("done").textContent = `cancelled: ${done.cancelled.join(", ") || "nothing was live"}`;
}

async function cancelRun() {
  const run = view.run;
  if (!window.confirm(`Cancel run ${run} of sweep ${view.name}? Slurm stops its job now; the other runs go on.`)) return;
  const done = await act(`runs/${encodeURIComponent(run)}/cancel`);
  if (done) $("done").textContent = `cancelled ${run}: ${done.cancelled.join(", ") || "nothing was live"}`;
  view.again();
}

async function resubmit() {
  if (!window.confirm(`Send again the runs of sweep ${view.name} that failed, timed out, lost their node, ran out of `
    + "memory, hung or were preempted? Each resumes from its newest checkpoint.")) return;
  const done = await act("resubmit");
  if (done) $("done").textContent = `resubmitted: ${done.resubmitted.join(", ") || "no run had ended so"}`;
  view.again();
}

async function act(action) {
  // an action is a POST of JSON from this page (the server refuses any other origin), after the user confirmed it
  try {
    return await ask(`/api/sweeps/${encodeURIComponent(view.name)}/${action}`,
      { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" });
  } catch (err) {
    $("problem").textContent = err.message;
    return null;
  }
}

if (document.body.dataset.page === "sweeps") sweepsPage();
else sweepPage();
