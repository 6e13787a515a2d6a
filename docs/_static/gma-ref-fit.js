// Scale each display equation that is wider than its block down to the block's width (not below
// MIN_SCALE; beyond that it scrolls, see gma-ref.css). Runs once MathJax has typeset the page and
// again when the window is resized.
(function () {
  const MIN_SCALE = 0.6;
  function fit() {
    document.querySelectorAll('mjx-container[display="true"]').forEach(function (eq) {
      eq.style.fontSize = "";
      const available = eq.parentElement ? eq.parentElement.clientWidth : eq.clientWidth;
      const needed = eq.scrollWidth;
      if (available > 0 && needed > available) {
        const scale = Math.max(MIN_SCALE, Math.floor((available / needed) * 100) / 100);
        eq.style.fontSize = (scale * 100).toFixed(0) + "%";
      }
    });
  }
  function whenTypeset() {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      MathJax.startup.promise.then(fit);
    } else {
      setTimeout(whenTypeset, 100);
    }
  }
  window.addEventListener("load", whenTypeset);
  window.addEventListener("resize", fit);
})();
