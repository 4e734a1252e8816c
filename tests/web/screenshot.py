"""Generate screenshots/web.png: the desk as the system's Chromium shows it.

    .venv/bin/python -m tests.web.screenshot [OUT.png]

Seeds a scratch inbox, starts a real `onwatch web` process, opens the page with Playwright in
the system's Chromium (never a downloaded one), shows the Approvals pane and saves the
browser's view.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from playwright.async_api import async_playwright

from .helpers import CHROMIUM, NO_CHROMIUM, Screen, WebProcess, launch
from .seed import seed

ROOT = Path(__file__).resolve().parents[2]


async def shoot(out: Path) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        db = Path(scratch) / "alice.db"
        await seed(db)
        web = WebProcess(db, Path(scratch)).start()
        try:
            async with async_playwright() as playwright:
                browser = await launch(playwright)
                page = await browser.new_page(viewport={"width": 1200, "height": 560})
                screen = Screen(page)
                await page.goto(web.link)
                await screen.wait_for("Pending", "msg-5")
                await page.keyboard.press("4")
                await screen.wait_for("send the daily digest")
                await page.wait_for_timeout(500)  # let the last frame paint
                await page.screenshot(path=str(out))
                await browser.close()
        finally:
            web.stop()


def main() -> int:
    if CHROMIUM is None:
        print(f"skipped: {NO_CHROMIUM}", file=sys.stderr)
        return 1
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "screenshots" / "web.png"
    asyncio.run(shoot(out))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
