/* The new-run form: the ticked devices are the pipeline, in the order shown (move them with
   the arrows; the form posts them in that order), and a device that has not profiled the
   chosen model says so before the form is sent. */
(function () {
  "use strict";
  const list = document.getElementById("device-choices");
  const spec = document.getElementById("id_model_spec");
  if (!list) return;

  function refresh() {
    let position = 0;
    for (const row of list.querySelectorAll(".choice")) {
      const box = row.querySelector("input[type=checkbox]");
      const pos = row.querySelector(".pos");
      pos.textContent = box.checked ? String((position += 1)) : "";
      const specs = (row.getAttribute("data-specs") || "").split(",").filter(Boolean);
      const missing = spec && spec.value && specs.indexOf(spec.value) < 0;
      row.classList.toggle("unprofiled", Boolean(missing));
      row.querySelector(".profile-note").textContent = missing ? " · has not profiled this model" : "";
    }
  }

  list.addEventListener("click", function (event) {
    const button = event.target.closest("[data-move]");
    if (!button) return;
    const row = button.closest(".choice");
    if (button.getAttribute("data-move") === "up" && row.previousElementSibling) {
      list.insertBefore(row, row.previousElementSibling);
    } else if (button.getAttribute("data-move") === "down" && row.nextElementSibling) {
      list.insertBefore(row.nextElementSibling, row);
    }
    refresh();
  });
  list.addEventListener("change", refresh);
  if (spec) spec.addEventListener("change", refresh);
  refresh();
})();
