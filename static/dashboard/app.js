// MemoryHub dashboard behaviour. No inline scripts anywhere (the Content-Security-Policy allows none):
// pages declare what they need with data- attributes and <script type="application/json"> blocks.
(function () {
  "use strict";

  // <button data-copy="#element-id">: copy that element's text to the clipboard.
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (!button) return;
    var source = document.querySelector(button.getAttribute("data-copy"));
    if (!source) return;
    var text = source.textContent.trim();
    var done = function () { button.textContent = "Copied"; setTimeout(function () { button.textContent = "Copy"; }, 2000); };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { selectText(source); });
    } else {
      selectText(source);
    }
  });

  function selectText(element) {
    var range = document.createRange();
    range.selectNodeContents(element);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }

  // <form data-confirm="Really?">: ask before submitting (forget, revoke, archive, remove…).
  document.addEventListener("submit", function (event) {
    var form = event.target.closest("form[data-confirm]");
    if (form && !window.confirm(form.getAttribute("data-confirm"))) event.preventDefault();
  });

  // <select data-autosubmit>: submit the surrounding filter form when the choice changes.
  document.addEventListener("change", function (event) {
    var field = event.target.closest("[data-autosubmit]");
    if (field && field.form) field.form.requestSubmit();
  });

  // <canvas data-chart="element-id-of-json">: draw a Chart.js chart from
  // {"type": "bar"|"line", "labels": [...], "datasets": [{"label", "data"}], "y_label": "...", "max": n}.
  var palette = ["#1f4fbf", "#c2571a", "#1d6b3a", "#7a3db8", "#a4161a"];
  function drawCharts(root) {
    if (typeof window.Chart === "undefined") return;
    root.querySelectorAll("canvas[data-chart]").forEach(function (canvas) {
      if (canvas.dataset.drawn) return;
      var source = document.getElementById(canvas.getAttribute("data-chart"));
      if (!source) return;
      var spec = JSON.parse(source.textContent);
      canvas.dataset.drawn = "1";
      new window.Chart(canvas, {
        type: spec.type || "bar",
        data: {
          labels: spec.labels,
          datasets: spec.datasets.map(function (set, i) {
            var colour = set.color || palette[i % palette.length];
            return { label: set.label, data: set.data, backgroundColor: colour, borderColor: colour,
                     fill: false, tension: 0.2, pointRadius: spec.type === "line" ? 2 : 0, stack: set.stack };
          })
        },
        options: {
          responsive: true, maintainAspectRatio: false, animation: false,
          plugins: { legend: { display: spec.datasets.length > 1 } },
          scales: {
            x: { stacked: !!spec.stacked, ticks: { maxTicksLimit: 10 } },
            y: { stacked: !!spec.stacked, beginAtZero: true, suggestedMax: spec.max,
                 title: { display: !!spec.y_label, text: spec.y_label } }
          }
        }
      });
    });
  }
  document.addEventListener("DOMContentLoaded", function () { drawCharts(document); });
  document.addEventListener("htmx:afterSettle", function (event) { drawCharts(event.target); });
})();
