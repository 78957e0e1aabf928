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

// A number in a table never breaks inside itself (a browser would break "7.9e-02" after its minus sign):
// each number with a sign or an exponent is kept whole (span.nobreak, book.css), while the cell may still
// wrap between numbers and words. Code (paths, hashes) is left alone.
const SIGNED_NUMBER = /(?<![\w.])[-+\u2212]?\d[\d.,]*(?:e[-+\u2212]?\d+)?(?![\w.])/gi;
function keepNumbersWhole(cell) {
  const texts = [];
  const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode())
    if (!n.parentElement.closest("code, pre, mjx-container, .math")) texts.push(n);
  for (const node of texts) {
    const text = node.textContent;
    const parts = [];
    let last = 0;
    for (const m of text.matchAll(SIGNED_NUMBER)) {
      if (!/[-+\u2212]/.test(m[0])) continue;  // only a sign or an exponent's minus gives a break opportunity
      parts.push(document.createTextNode(text.slice(last, m.index)));
      const span = document.createElement("span");
      span.className = "nobreak";
      span.textContent = m[0];
      parts.push(span);
      last = m.index + m[0].length;
    }
    if (!parts.length) continue;
    parts.push(document.createTextNode(text.slice(last)));
    node.replaceWith(...parts);
  }
}
document.addEventListener("DOMContentLoaded", () => {
  for (const cell of document.querySelectorAll(".bd-article td, .bd-article th")) keepNumbersWhole(cell);
});

// A table wider than the column scrolls inside its own box: say so above it, on any screen where it does.
function markScrollingTables() {
  for (const table of document.querySelectorAll(".bd-article table")) {
    let hint = table.previousElementSibling;
    if (!(hint && hint.classList.contains("table-scroll-hint"))) {
      hint = document.createElement("div");
      hint.className = "table-scroll-hint";
      hint.textContent = "Scroll the table sideways for all its columns \u2192";
      table.before(hint);
    }
    hint.hidden = table.scrollWidth <= table.clientWidth + 1;
  }
}
document.addEventListener("DOMContentLoaded", markScrollingTables);
window.addEventListener("load", markScrollingTables);
window.addEventListener("resize", markScrollingTables);

// Punctuation after a short inline formula stays on its line ("... by O(η²)." never leaves the "." alone
// at the start of the next line): the formula and the punctuation go into one span.nobreak. Done before
// MathJax typesets (it finds the formula inside the span); long formulas keep MathJax's own line breaks.
const TRAILING_PUNCTUATION = /^[.,;:!?)\]]+/;
document.addEventListener("DOMContentLoaded", () => {
  for (const math of document.querySelectorAll(".bd-article span.math")) {
    const next = math.nextSibling;
    if (!next || next.nodeType !== Node.TEXT_NODE || math.textContent.length > 40) continue;
    const punctuation = next.textContent.match(TRAILING_PUNCTUATION);
    if (!punctuation) continue;
    const span = document.createElement("span");
    span.className = "nobreak";
    math.before(span);
    span.append(math, punctuation[0]);
    next.textContent = next.textContent.slice(punctuation[0].length);
  }
});
