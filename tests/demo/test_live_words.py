"""The live demo names its keys truly: every key a narration line mentions ("press K",
"(i)") is the key that does it, read from the bindings, not typed into the text."""

from __future__ import annotations

import re

from onwatch.tui.actions import KEYS
from onwatch.tui.demo.live import LiveDemoApp, open_scratch_inbox

MENTIONED = re.compile(r"(?:press |\()([A-Za-z])(?:\)| )")


async def test_every_key_a_live_narration_names_is_the_key_that_does_it(tmp_path):
    inbox = await open_scratch_inbox(str(tmp_path))
    app = LiveDemoApp(inbox, str(tmp_path), workers=0)  # no process: the words only
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("t")  # the policy switch tells which keys to try next
            await pilot.pause()
            await pilot.press("K")  # nobody holds the lease: says so
            await pilot.pause()
            story = "\n".join(app.story)
            assert "kill the active worker (K)" in story and "(k)" not in story
            assert "press i to send messages" in story.lower()
            bound = {b.key: b.action for b in app.BINDINGS} | {d.key: n for n, d in KEYS.items()}
            named = MENTIONED.findall(story)
            assert {"i", "K"} <= set(named)
            assert all(key in bound for key in named), (named, story)
            assert app.key("kill") == "K" and bound["K"] == "kill"
    finally:
        app.stop_workers()
        await inbox.close()
