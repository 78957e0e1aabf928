// Every figure of the book links to its image alone: on a phone a figure fits the column and is small,
// and the image opened by itself can be zoomed (book.css shows the hint on narrow screens).
document.addEventListener("DOMContentLoaded", () => {
  for (const img of document.querySelectorAll(".bd-article figure img")) {
    if (img.closest("a")) continue;
    const link = document.createElement("a");
    link.href = img.getAttribute("src");
    link.className = "figure-full-size";
    link.title = "Open the figure at full size";
    img.replaceWith(link);
    link.appendChild(img);
  }
});

// A text output that is prose, not a table, wraps at the column's edge instead of running past it
// (book.css: .prose-output); a table (two or more lines with columns set apart by runs of spaces) keeps
// its alignment and scrolls. Lines break only at spaces, never inside a number.
const TABULAR = /\S {2,}\S/;
document.addEventListener("DOMContentLoaded", () => {
  for (const pre of document.querySelectorAll(".bd-article .cell_output pre")) {
    const lines = pre.textContent.split("\n").filter(line => line.trim());
    if (lines.filter(line => TABULAR.test(line.trim())).length < 2) pre.classList.add("prose-output");
  }
});
