// Renders the maths that pymdownx.arithmatex (generic mode) leaves in the page:
// \( ... \) inline and \[ ... \] as a block, inside elements of class "arithmatex".
// KaTeX ships with the site (docs/assets/katex/), so the pages render offline.
(function () {
  function render() {
    var nodes = document.querySelectorAll(".arithmatex");
    for (var i = 0; i < nodes.length; i++) {
      renderMathInElement(nodes[i], {
        delimiters: [
          { left: "\\(", right: "\\)", display: false },
          { left: "\\[", right: "\\]", display: true },
        ],
        throwOnError: false,
      });
    }
  }
  // Material's instant navigation swaps pages without a reload: document$ fires on each.
  if (typeof document$ !== "undefined") {
    document$.subscribe(render);
  } else if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", render);
  } else {
    render();
  }
})();
