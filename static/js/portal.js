// Keeps job logs scrolled to their end while new output arrives, unless the reader has
// scrolled up to read something: the 1 s poll replaces the <pre>, which would otherwise
// jump back to the top on every refresh.
(function () {
  "use strict";
  const FOLLOW_SLACK_PX = 24;
  const kept = new Map(); // log id -> {follow, top}

  function scrollLogs(root) {
    root.querySelectorAll("pre.log[id]").forEach(function (log) {
      const state = kept.get(log.id);
      if (!state || state.follow) {
        log.scrollTop = log.scrollHeight;
      } else {
        log.scrollTop = state.top;
      }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    scrollLogs(document);
  });

  document.addEventListener("htmx:beforeSwap", function (event) {
    event.detail.target.querySelectorAll("pre.log[id]").forEach(function (log) {
      const atEnd = log.scrollHeight - log.scrollTop - log.clientHeight <= FOLLOW_SLACK_PX;
      kept.set(log.id, { follow: atEnd, top: log.scrollTop });
    });
  });

  document.addEventListener("htmx:afterSettle", function () {
    scrollLogs(document);
  });
})();
