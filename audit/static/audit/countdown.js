// SLA countdowns on the rep's page: "due in 12 min" / "overdue by 3 min", updated every 15 s.
// The server renders a plain time first, so the page reads right without this script.
(function () {
  "use strict";
  function words(ms) {
    var minutes = Math.round(Math.abs(ms) / 60000);
    if (minutes < 60) return minutes + " min";
    var hours = Math.floor(minutes / 60);
    if (hours < 48) return hours + " h " + (minutes % 60) + " min";
    return Math.floor(hours / 24) + " days";
  }
  function tick() {
    var now = Date.now();
    var items = document.querySelectorAll(".countdown[data-due]");
    for (var i = 0; i < items.length; i++) {
      var due = Date.parse(items[i].getAttribute("data-due"));
      if (isNaN(due)) continue;
      var left = due - now;
      items[i].textContent = left >= 0 ? "due in " + words(left) : "overdue by " + words(left);
      items[i].className = items[i].className.replace(/\bsla-(open|breached)\b/, left >= 0 ? "sla-open" : "sla-breached");
    }
  }
  document.addEventListener("DOMContentLoaded", function () {
    tick();
    setInterval(tick, 15000);
  });
})();
