// Filters the validation samples by the search box (case-insensitive substring of the row's text).
// "#search=TEXT" in the address starts with that filter. Sets data-ready on <body> once it has run.
(function () {
  "use strict";
  var body = document.body;
  try {
    var box = document.getElementById("sample-search");
    var status = document.getElementById("search-count");
    var blocks = Array.prototype.slice.call(document.querySelectorAll("details.samples-step"));
    var rows = [];
    blocks.forEach(function (block) {
      block.querySelectorAll("tr.sample").forEach(function (row) {
        rows.push({ row: row, block: block, text: row.textContent.toLowerCase() });
      });
    });
    var apply = function () {
      var query = box ? box.value.trim().toLowerCase() : "";
      var hits = new Map();
      var shown = 0;
      rows.forEach(function (r) {
        var hit = query === "" || r.text.indexOf(query) !== -1;
        r.row.hidden = !hit;
        if (hit) {
          shown += 1;
          hits.set(r.block, (hits.get(r.block) || 0) + 1);
        }
      });
      blocks.forEach(function (block) {
        var count = block.querySelector(".match-count");
        var n = hits.get(block) || 0;
        if (count) count.textContent = query === "" ? "" : n + " match" + (n === 1 ? "" : "es");
        if (query !== "" && n > 0) block.open = true;
      });
      if (status) {
        status.textContent = query === "" ? rows.length + " rows" : shown + " of " + rows.length + " rows match";
      }
      body.setAttribute("data-matches", String(shown));
    };
    if (box) {
      var hash = /^#search=(.*)$/.exec(window.location.hash);
      if (hash) {
        try {
          box.value = decodeURIComponent(hash[1]);
        } catch (malformed) {
          box.value = hash[1]; // "#search=100%": not a valid escape, taken as typed
        }
      }
      box.addEventListener("input", apply);
      apply();
    }
    body.setAttribute("data-ready", "ok");
  } catch (error) {
    body.setAttribute("data-ready", "error: " + error.message);
    throw error;
  }
})();
