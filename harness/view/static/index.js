// The "Distributed view" tab of TensorBoard: pick a run, see its view (an iframe on ./view).
// Loaded by TensorBoard's plugin_entry.html, whose <base> makes "./x" mean this plugin's route x.

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  Object.entries(attrs || {}).forEach(([k, v]) => node.setAttribute(k, v));
  if (text !== undefined) node.textContent = text;
  return node;
}

async function getRuns() {
  const response = await fetch("./runs");
  if (!response.ok) throw new Error("runs: HTTP " + response.status);
  return response.json();
}

export async function render() {
  document.body.style.margin = "0";
  document.body.style.fontFamily = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
  const bar = el("div", { id: "bar", style: "padding: 8px 16px; border-bottom: 1px solid #e0e0e0; font-size: 14px;" });
  const label = el("label", { for: "run" }, "Run ");
  const select = el("select", { id: "run" });
  const status = el("span", { id: "status", style: "margin-left: 12px; color: #5f6368;" });
  const button = el("button", { id: "collect", style: "margin-left: 12px; display: none;" }, "Analyse now");
  // Compare: the selected run (BASE) against another (NEW), on the plugin's comparison page.
  const other = el("select", { id: "compare-with", style: "margin-left: 12px;" });
  const compare = el("button", { id: "compare", style: "margin-left: 4px;" }, "Compare");
  bar.append(label, select, button, el("span", { style: "margin-left: 12px;" }, "with "), other, compare, status);
  const frame = el("iframe", { id: "view", title: "distributed view",
                               style: "border: 0; width: 100%; height: calc(100vh - 46px); display: block;" });
  document.body.append(bar, frame);

  let runs = [];
  function show(name) {
    const run = runs.find((r) => r.run === name);
    if (!run) return;
    button.style.display = run.has_report ? "none" : "inline";
    status.textContent = run.has_report ? run.traces + " trace file(s)" :
      "no report yet: " + run.collect_command;
    frame.src = "./view?run=" + encodeURIComponent(name);
  }
  async function refresh(keep) {
    runs = await getRuns();
    select.replaceChildren(...runs.map((r) => el("option", { value: r.run }, r.run + (r.has_report ? "" : " (no report)"))));
    other.replaceChildren(...runs.map((r) => el("option", { value: r.run }, r.run)));
    if (!runs.length) {
      status.textContent = "No run with profiler traces under the logdir. Train with: " +
        "torchrun --nproc_per_node 2 -m harness.train, then python -m harness.collect profiler_logs/<run>";
      return;
    }
    const pick = runs.find((r) => r.run === keep) || runs.find((r) => r.has_report) || runs[0];
    select.value = pick.run;
    show(pick.run);
  }
  select.addEventListener("change", () => show(select.value));
  compare.addEventListener("click", () => {
    frame.src = "./compare?base=" + encodeURIComponent(select.value) + "&new=" + encodeURIComponent(other.value);
  });
  // "Analyse now": the collector runs in its own process; the page polls its progress.
  async function follow(name) {
    for (;;) {
      await new Promise((resolve) => setTimeout(resolve, 500));
      const response = await fetch("./collect_status?run=" + encodeURIComponent(name));
      const job = await response.json();
      if (job.state === "running") {
        const count = job.total ? " " + job.done + "/" + job.total : "";
        status.textContent = "analysing " + name + ": " + job.stage + count + " (" + Math.round(job.elapsed_s) + " s)";
        continue;
      }
      return job;
    }
  }
  button.addEventListener("click", async () => {
    const name = select.value;
    button.disabled = true;
    status.textContent = "starting the collector on " + name + " ...";
    try {
      const response = await fetch("./collect?run=" + encodeURIComponent(name), { method: "POST" });
      const started = await response.json();
      if (!started.ok) {
        status.textContent = "collector not started: " + started.message;
        return;
      }
      const job = await follow(name);
      status.textContent = job.state === "done" ? "done: " + job.message : "collector failed: " + job.message;
      if (job.state === "done") await refresh(name);
    } catch (err) {
      status.textContent = "collector failed: " + err;
    } finally {
      button.disabled = false;
    }
  });
  try {
    await refresh(null);
  } catch (err) {
    status.textContent = "cannot list runs: " + err;
  }
}
