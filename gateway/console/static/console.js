// The console's only script of its own: the copy buttons of a new secret and its env lines.
// (No inline scripts: the console's Content-Security-Policy allows scripts from 'self' only.)
document.addEventListener("click", function (event) {
  var button = event.target.closest("button[data-copy]");
  if (!button) return;
  var source = document.getElementById(button.getAttribute("data-copy"));
  if (!source) return;
  var text = source.textContent;
  var done = function () { button.textContent = "Copied"; };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done, function () { select(source); });
  } else {
    select(source);
  }
});

function select(node) {
  var range = document.createRange();
  range.selectNodeContents(node);
  var selection = window.getSelection();
  selection.removeAllRanges();
  selection.addRange(range);
}
