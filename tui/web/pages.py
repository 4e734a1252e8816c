"""The pages `onwatch web` writes itself: the desk page around textual-serve's terminal, the
login page, and the one-paragraph pages of a refusal.

Every value put into a page goes through `html.escape` (an inbox file's name is anyone's
text). Each page carries its own Content-Security-Policy: scripts only from this server and
the inline scripts below by their SHA-256 (no `unsafe-inline` for scripts), nothing from
elsewhere, no framing, forms posting only here.
"""

from __future__ import annotations

import base64
import hashlib
from html import escape

# The terminal's font ships with textual-serve; a web font from elsewhere would be blocked.
_STYLE = """
html, body { margin: 0; height: 100%; background: #0c181f; color: #e8eef2;
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; }
main { max-width: 28rem; margin: 12vh auto 0; padding: 0 1.25rem; }
h1 { font-size: 1.3rem; font-weight: 600; margin: 0 0 1rem; overflow-wrap: anywhere; }
p { margin: 0 0 1rem; }
.message { color: #ffcf70; }
label { display: block; margin-bottom: .35rem; }
input { box-sizing: border-box; width: 100%; padding: .6rem; font: inherit;
  border: 1px solid #3a5566; border-radius: 4px; background: #12232d; color: inherit; }
button { margin-top: .8rem; padding: .55rem 1.2rem; font: inherit; border: 0;
  border-radius: 4px; background: #5e0ba7; color: #fff; cursor: pointer; }
code { font-family: ui-monospace, Menlo, monospace; }
"""

_LOGIN_SCRIPT = """
(function () {
  var found = /^#code=([A-Za-z0-9_-]+)$/.exec(window.location.hash);
  if (!found) return;
  // The one-time code leaves the address bar before anything else happens.
  window.history.replaceState(null, "", window.location.pathname);
  var form = document.getElementById("login");
  form.elements.code.value = found[1];
  form.elements.token.required = false;
  form.submit();
})();
"""

_DESK_SCRIPT = """
(function () {
  if (window.location.hash) {
    window.history.replaceState(null, "", window.location.pathname + window.location.search);
  }
  var terminal = document.getElementById("terminal");
  if (!new URLSearchParams(window.location.search).has("fontsize")) {
    // As many of 80 columns as fit without the text becoming unreadable (a phone).
    var size = Math.floor(window.innerWidth / 80 / 0.6);
    terminal.dataset.fontSize = String(Math.max(9, Math.min(16, size)));
  }
  window.addEventListener("load", function () {
    // textual.js builds the terminal in its own load handler, which runs first: focus it,
    // so that keys work without a click.
    var input = document.querySelector(".xterm-helper-textarea");
    if (input) input.focus();
  });
})();
"""

_DESK_STYLE = """
@font-face { font-family: "Roboto Mono";
  src: url("{static}fonts/RobotoMono-VariableFont_wght.ttf") format("truetype");
  font-weight: 100 700; }
html, body { margin: 0; height: 100%; overflow: hidden; background: #0c181f; color: #e8eef2;
  font: 13px/1 system-ui, -apple-system, "Segoe UI", sans-serif; }
#bar { position: fixed; top: 0; left: 0; right: 0; height: 28px; box-sizing: border-box;
  display: flex; align-items: center; gap: 10px; padding: 0 8px; background: #12232d; }
#bar .name { flex: 1; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
#bar form { margin: 0; }
#bar button { padding: 4px 10px; font: inherit; border: 0; border-radius: 3px;
  background: #26414f; color: inherit; cursor: pointer; }
#terminal { position: fixed; top: 28px; left: 0; right: 0; bottom: 0;
  width: auto; height: auto; }
#ended { display: none; position: fixed; left: 0; right: 0; bottom: 0; z-index: 10;
  padding: 10px 12px; gap: 12px; align-items: center; background: #5e0ba7; color: #fff; }
#ended a { color: #fff; font-weight: 600; }
body.-closed #ended { display: flex; }
"""


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


_COMMON_POLICY = "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
PAGE_POLICY = (
    f"default-src 'none'; script-src {_sha256(_LOGIN_SCRIPT)}; style-src {_sha256(_STYLE)}; "
    f"img-src data:; {_COMMON_POLICY}"
)
# The desk: textual.js from here, our one inline script; xterm.js sets inline styles as it
# draws, so styles may be inline; the websocket goes back to this server ('self').
DESK_POLICY = (
    f"default-src 'self'; script-src 'self' {_sha256(_DESK_SCRIPT)}; "
    f"style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self'; "
    f"connect-src 'self'; {_COMMON_POLICY}"
)
# Everything else this server answers (scripts, refusals as text): nothing may run or load.
DEFAULT_POLICY = f"default-src 'none'; {_COMMON_POLICY}"


def _document(title: str, body: str, *, script: str = "") -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n"
        '<link rel="icon" href="data:,">\n'
        f"<style>{_STYLE}</style>\n</head>\n<body>\n{body}\n"
        + (f"<script>{script}</script>\n" if script else "")
        + "</body>\n</html>\n"
    )


def login_page(title: str, message: str = "") -> str:
    """The page a browser without a session gets: a form for the token, and the script that
    posts the one-time code of the start-up link (in the address's fragment, which no
    request carries and the script removes at once)."""
    shown = f'<p class="message" role="alert">{escape(message)}</p>\n' if message else ""
    body = (
        f"<main>\n<h1>{escape(title)}</h1>\n{shown}"
        '<form method="post" action="/login" id="login">\n'
        '<label for="token">Token</label>\n'
        '<input id="token" name="token" type="password" autocomplete="current-password" '
        "required autofocus>\n"
        '<input type="hidden" name="code" value="">\n'
        '<button type="submit">Open the desk</button>\n</form>\n'
        "<p>Open the address <code>onwatch web</code> printed when it started, or enter its "
        "token (<code>$ONWATCH_WEB_TOKEN</code>, or the one it printed).</p>\n</main>"
    )
    return _document(title, body, script=_LOGIN_SCRIPT)


def message_page(title: str, text: str) -> str:
    """A refusal or a notice, as one paragraph."""
    body = f"<main>\n<h1>{escape(title)}</h1>\n<p>{escape(text)}</p>\n</main>"
    return _document(title, body)


def desk_page(*, title: str, name: str, websocket_url: str, static_url: str, font_size: int) -> str:
    """The page around textual-serve's terminal: its title and bar name the inbox, the page
    fits a phone's width, the terminal has the keyboard from the start, and a bar offers
    logging out."""
    static = escape(static_url, quote=True)
    style = _DESK_STYLE.replace("{static}", static)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n"
        '<link rel="icon" href="data:,">\n'
        f'<link rel="stylesheet" href="{static}css/xterm.css">\n'
        f'<script src="{static}js/textual.js"></script>\n'
        f"<style>{style}</style>\n</head>\n<body>\n"
        f'<header id="bar"><span class="name">{escape(name)}</span>'
        '<form method="post" action="/logout"><button type="submit">Log out</button></form>'
        "</header>\n"
        f'<div id="terminal" class="textual-terminal" '
        f'data-session-websocket-url="{escape(websocket_url, quote=True)}" '
        f'data-font-size="{int(font_size)}"></div>\n'
        '<div id="ended" role="status">This desk has ended. <a href="/">Open it again</a></div>\n'
        f"<script>{_DESK_SCRIPT}</script>\n</body>\n</html>\n"
    )
