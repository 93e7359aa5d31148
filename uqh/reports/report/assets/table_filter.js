// Filter boxes of long tables: keep the rows whose text contains every word typed (case-insensitive).
(function () {
  for (const input of document.querySelectorAll("input[data-filter]")) {
    const name = input.dataset.filter;
    const table = document.querySelector(`table[data-table="${CSS.escape(name)}"]`);
    const count = document.querySelector(`[data-filter-count="${CSS.escape(name)}"]`);
    if (!table) continue;
    const rows = Array.from(table.tBodies[0].rows);
    const texts = rows.map((r) => r.textContent.toLowerCase());
    input.addEventListener("input", () => {
      const words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
      let shown = 0;
      rows.forEach((row, i) => {
        const keep = words.every((w) => texts[i].includes(w));
        row.hidden = !keep;
        shown += keep;
      });
      if (count) count.textContent = `${shown} of ${rows.length} rows`;
    });
  }
})();
