// The catalogue's filters: hide the rows whose family / status cell differs from the chosen value. The choice is
// kept in the URL (?family=...&status=...), so that a filtered view can be linked to.
(function () {
  function setUp() {
    var box = document.getElementById("catalogue-filters");
    if (!box || box.dataset.ready) return;
    box.dataset.ready = "1";
    var table = document.querySelector("article table");
    if (!table) return;
    var heads = Array.prototype.map.call(table.querySelectorAll("thead th"), function (th) {
      return th.textContent.trim();
    });
    var selects = box.querySelectorAll("select[data-filter]");
    var params = new URLSearchParams(window.location.search);
    selects.forEach(function (s) {
      if (params.get(s.dataset.filter)) s.value = params.get(s.dataset.filter);
    });
    function apply() {
      var shown = 0;
      var query = new URLSearchParams();
      table.querySelectorAll("tbody tr").forEach(function (row) {
        var keep = true;
        selects.forEach(function (s) {
          var column = heads.indexOf(s.dataset.filter);
          if (s.value && row.cells[column].textContent.trim() !== s.value) keep = false;
        });
        row.hidden = !keep;
        if (keep) shown += 1;
      });
      selects.forEach(function (s) {
        if (s.value) query.set(s.dataset.filter, s.value);
      });
      var text = query.toString();
      history.replaceState(null, "", window.location.pathname + (text ? "?" + text : ""));
      document.getElementById("catalogue-count").textContent = shown + " shown";
    }
    selects.forEach(function (s) {
      s.addEventListener("change", apply);
    });
    apply();
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setUp);
  else setUp();
})();
