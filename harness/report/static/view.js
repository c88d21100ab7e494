// Charts of the distributed view, drawn with Plotly from the JSON block the page embeds.
// Shared by report.html and the TensorBoard plugin page; fetches nothing.
(function () {
  "use strict";

  var PLOT_CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["sendDataToCloud"] };
  var PHASE_COLORS = {
    data: "#8c564b", h2d: "#9467bd", forward: "#1f77b4", loss: "#17becf",
    backward: "#ff7f0e", optimizer: "#2ca02c"
  };
  var OTHER_COLOR = "#7f7f7f";

  function rankLabel(r) { return "rank " + r; }

  function grid(rows, ranks, steps, key) {
    // rows: report.steps; returns z[rank index][step index] (null where a rank has no such step)
    var ri = {}, si = {};
    ranks.forEach(function (r, i) { ri[r] = i; });
    steps.forEach(function (s, i) { si[s] = i; });
    var z = ranks.map(function () { return steps.map(function () { return null; }); });
    rows.forEach(function (row) {
      if (row.rank in ri && row.step in si) { z[ri[row.rank]][si[row.step]] = row[key]; }
    });
    return z;
  }

  function heatmap(id, report, key, title, colorscale, rows, unit) {
    // rows: report.steps unless given (the memory heatmap reads report.memory_steps)
    rows = rows || report.steps;
    unit = unit || "ms";
    var ranks = rows === report.steps ? report.ranks.map(function (r) { return r.rank; })
      : Array.from(new Set(rows.map(function (s) { return s.rank; }))).sort(function (a, b) { return a - b; });
    var steps = Array.from(new Set(rows.map(function (s) { return s.step; }))).sort(function (a, b) { return a - b; });
    var trace = {
      type: "heatmap", z: grid(rows, ranks, steps, key), x: steps, y: ranks.map(rankLabel),
      colorscale: colorscale, colorbar: { title: { text: unit } }, hoverongaps: false,
      // memory: a rank reads its RSS within a time budget, not every short step; a step
      // without a reading is drawn from its neighbours (and has no hover), not left a hole
      connectgaps: rows !== report.steps,
      hovertemplate: "%{y}, step %{x}<br>" + title + ": %{z:.2f} " + unit + "<extra></extra>"
    };
    var layout = {
      title: { text: title + " (" + unit + ") per rank and step" }, height: Math.max(220, 60 + 28 * ranks.length),
      margin: { l: 80, r: 20, t: 40, b: 40 }, xaxis: { title: { text: "step" }, type: "category" },
      yaxis: { autorange: "reversed", type: "category" }
    };
    return Plotly.newPlot(id, [trace], layout, PLOT_CONFIG);
  }

  function bars(id, report) {
    var y = report.ranks.map(function (r) { return rankLabel(r.rank); });
    function part(name, color, f) {
      return {
        type: "bar", orientation: "h", name: name, y: y, marker: { color: color },
        x: report.ranks.map(f), hovertemplate: "%{y}: " + name + " %{x:.2f} ms<extra></extra>"
      };
    }
    var data = [
      part("compute only", "#1f77b4", function (r) { return Math.max(r.compute_ms - r.overlapped_comm_ms, 0); }),
      part("overlapped communication", "#2ca02c", function (r) { return r.overlapped_comm_ms; }),
      part("exposed transfer", "#d62728", function (r) {
        // reports written before the split have exposed_comm_ms only
        return r.exposed_transfer_ms === undefined ? r.exposed_comm_ms : r.exposed_transfer_ms;
      }),
      part("exposed waiting for peers", "#ff9896", function (r) { return r.exposed_wait_ms || 0; }),
      part("idle", "#c7c7c7", function (r) { return r.idle_ms; })
    ];
    var layout = {
      barmode: "stack", title: { text: "Device time per rank over the analysed steps (ms)" },
      height: Math.max(240, 110 + 30 * y.length), margin: { l: 80, r: 20, t: 40, b: 60 },
      yaxis: { autorange: "reversed", type: "category" },
      legend: { orientation: "h", x: 0, y: -0.2, yanchor: "top", traceorder: "normal" }
    };
    return Plotly.newPlot(id, data, layout, PLOT_CONFIG);
  }

  function timeline(id, tl) {
    // Each lane is a category; phase bars sit in its upper half, collectives in its lower half
    // (the y axis is reversed, so a negative offset draws above the lane's centre).
    var lanes = tl.ranks.map(function (r) { return rankLabel(r.rank) + " (" + r.host + ")"; });
    var groups = {};
    function push(key, spec, y, start, end, text) {
      var g = groups[key] || (groups[key] = Object.assign({ y: [], base: [], x: [], text: [] }, spec));
      g.y.push(y); g.base.push(start); g.x.push(Math.max(end - start, 0)); g.text.push(text);
    }
    tl.ranks.forEach(function (lane, i) {
      var y = lanes[i];
      lane.steps.forEach(function (s) {
        push("step", { name: "step", color: "#e8e8e8", offset: -0.45, width: 0.9 }, y, s[1], s[2],
          "step " + s[0] + ": " + (s[2] - s[1]).toFixed(2) + " ms");
      });
      lane.phases.forEach(function (p) {
        push("phase:" + p[0], { name: p[0], color: PHASE_COLORS[p[0]] || OTHER_COLOR, offset: -0.42, width: 0.4 }, y,
          p[2], p[3], p[0] + " (step " + p[1] + "): " + (p[3] - p[2]).toFixed(2) + " ms");
      });
      lane.collectives.forEach(function (c) {
        var wait = c[4] || 0, name = c[0], step = c[1] === null ? "-" : c[1];
        var waitEnd = Math.min(c[2] + wait, c[3]);
        if (wait > 0) {
          push("wait", { name: "wait for last arriver", color: "#d62728", offset: 0.02, width: 0.4 }, y, c[2], waitEnd,
            "waits " + wait.toFixed(2) + " ms for rank " + c[5] + " before " + name + " (step " + step + ")");
        }
        push("collective", { name: "collective", color: "#111111", offset: 0.02, width: 0.4 }, y, waitEnd, c[3],
          name + " (step " + step + "): " + (c[3] - c[2]).toFixed(2) + " ms" +
          (c[4] === null ? ", not matched on another rank" : ", of which waiting " + wait.toFixed(2) + " ms"));
      });
    });
    var order = ["step"].concat(Object.keys(groups).filter(function (k) { return k.indexOf("phase:") === 0; }), ["wait", "collective"]);
    var data = order.filter(function (k) { return groups[k]; }).map(function (k) {
      var g = groups[k];
      return {
        type: "bar", orientation: "h", name: g.name, y: g.y, base: g.base, x: g.x, text: g.text,
        offset: g.offset, width: g.width, marker: { color: g.color }, textposition: "none",
        hovertemplate: "%{text}<br>%{base:.2f} ms<extra></extra>"
      };
    });
    var layout = {
      barmode: "overlay", height: Math.max(260, 110 + 60 * lanes.length), margin: { l: 170, r: 20, t: 50, b: 50 },
      xaxis: { title: { text: "ms on the aligned clock" }, zeroline: false },
      yaxis: { type: "category", autorange: "reversed", fixedrange: true, categoryarray: lanes, categoryorder: "array" },
      dragmode: "zoom", legend: { orientation: "h", x: 0, y: 1.0, yanchor: "bottom" }, bargap: 0
    };
    return Plotly.newPlot(id, data, layout, PLOT_CONFIG);
  }

  function fail(id, message) {
    var el = document.getElementById(id);
    if (el) { el.textContent = message; el.className += " failed"; }
  }

  function main() {
    var state = window.harnessView = { ready: false, charts: [] };
    var data = JSON.parse(document.getElementById("harness-data").textContent);
    var report = data.report, tl = data.timeline;
    if (typeof Plotly === "undefined") {
      ["bars", "heatmap-step", "heatmap-wait", "heatmap-memory", "timeline"].forEach(function (id) {
        fail(id, "Charts unavailable: plotly.min.js did not load.");
      });
      state.ready = true;
      return;
    }
    var jobs = [];
    if (report.steps.length) {
      jobs.push(heatmap("heatmap-step", report, "host_step_ms", "step time", "Viridis"));
      jobs.push(heatmap("heatmap-wait", report, "wait_ms", "wait for others", "Reds"));
    } else {
      fail("heatmap-step", "No steps analysed.");
    }
    var mem = report.memory_steps || [];
    if (mem.length) {
      // GPU allocated when the run logged it (a CUDA run), else host RSS
      var gpu = mem.some(function (r) { return r.gpu_allocated_mb !== null && r.gpu_allocated_mb !== undefined; });
      jobs.push(heatmap("heatmap-memory", report, gpu ? "gpu_allocated_mb" : "rss_mb",
        gpu ? "GPU peak allocated" : "host RSS", "Blues", mem, "MB"));
    } else {
      fail("heatmap-memory", "No memory heatmap: no step logs next to the traces.");
    }
    jobs.push(bars("bars", report));
    if (tl && tl.ranks.length) {
      jobs.push(timeline("timeline", tl));
      if (tl.steps_shown < tl.steps_total) {
        document.getElementById("timeline-cut").textContent =
          "Showing the first " + tl.steps_shown + " of " + tl.steps_total + " steps (browser drawing limit).";
      }
    } else {
      fail("timeline", "No timeline: timeline.json is missing (re-run the collector).");
    }
    Promise.all(jobs).then(function () {
      state.charts = ["heatmap-step", "heatmap-wait", "heatmap-memory", "bars", "timeline"].filter(function (id) {
        var el = document.getElementById(id);
        return el && el.data;
      });
      state.ready = true;
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", main);
  } else {
    main();
  }
})();
