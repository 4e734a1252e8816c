"""Every code block of README.md and docs/*.md that is a shell command or a Python snippet
runs as written (tests/docs/running.py says how) or is marked, visibly, as not run with the
reason; and the harness itself fails on a block that fails."""

from __future__ import annotations

import pytest

from tests.docs.blocks import ROOT, PageError, blocks_of, pages
from tests.docs import running
from tests.docs.running import BlockFailed, commands, run_page

PAGES = [str(path.relative_to(ROOT)) for path in pages()]


@pytest.mark.parametrize("page", PAGES)
def test_every_block_says_what_it_is(page):
    """A fence names its language; an indented block, a fence without one, or a marker
    that is not followed by its block is an error saying where."""
    for block in blocks_of((ROOT / page).read_text(encoding="utf-8"), page):
        if block.not_run is not None:
            assert len(block.not_run) >= 10, f"{block.where}: say why it is not run"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_the_blocks_of_each_page_run(page, tmp_path):
    run_page(blocks_of((ROOT / page).read_text(encoding="utf-8"), page), tmp_path)


# The harness: a page whose block fails must fail the test, and a marker must be seen.


def page(text: str) -> list:
    return blocks_of(text, "page.md")


def test_a_failing_command_fails(tmp_path):
    with pytest.raises(BlockFailed, match=r"page.md:1: `onwatch ingest nothing.db"):
        run_page(page("```sh\nonwatch ingest nothing.db chat m1\n```\n"), tmp_path)


def test_a_command_that_does_not_print_what_the_page_says_fails(tmp_path):
    text = "```sh\nonwatch init a.db\nonwatch ingest a.db chat m1  # → duplicate\n```\n"
    with pytest.raises(BlockFailed, match="no 'duplicate' in what it printed"):
        run_page(page(text), tmp_path)


def test_a_failing_python_block_fails_and_top_level_await_works(tmp_path):
    good = "```python\nimport asyncio\nawait asyncio.sleep(0)\nprint('ok')  # → ok\n```\n"
    assert run_page(page(good), tmp_path / "a") == 1
    with pytest.raises(BlockFailed, match="the Python block exited 1"):
        run_page(page("```python\nraise SystemExit(1)\n```\n"), tmp_path / "b")


def test_a_block_marked_not_run_is_not_run_and_a_file_is_written(tmp_path):
    text = (
        "<!-- not run: it would fail, and says so here -->\n"
        "```sh\nfalse\n```\n\n"
        "<!-- file: agent.py -->\n"
        "```python\nasync def handle(batch, ctx):\n    ctx.reply('hi')\n```\n\n"
        "```sh\ntest -f agent.py\n```\n"
    )
    blocks = page(text)
    assert [b.not_run for b in blocks] == ["it would fail, and says so here", None, None]
    assert run_page(blocks, tmp_path) == 1


@pytest.mark.parametrize(
    "text, error",
    [
        ("    onwatch init a.db\n", "indented code block"),
        ("```\nonwatch init a.db\n```\n", "without a language"),
        ("<!-- not run: why not -->\n\ntext\n", "must come just before"),
        ("<!-- file: a.py -->\n", "no code block after it"),
    ],
)
def test_a_block_that_does_not_say_what_it_is_is_an_error(text, error):
    with pytest.raises(PageError, match=error):
        page(text)


def test_commands_join_continuations_and_read_expectations():
    found = commands(
        "# a comment\nonwatch worker a.db \\\n    --agent m:f   # → echo: hi\n\n"
        "echo '# not a comment'\n"
    )
    assert [(c.line, c.expect) for c in found] == [
        ("onwatch worker a.db --agent m:f", "echo: hi"),
        ("echo '# not a comment'", None),
    ]


def test_a_worker_that_never_prints_what_the_page_says_fails(tmp_path, monkeypatch):
    """A command that keeps running is started, must come up, and is held to its `# →`."""
    monkeypatch.setattr(running, "RETRY_WITHIN", 2.0)
    text = (
        "```sh\nonwatch init a.db\n"
        "onwatch worker a.db --agent examples.refund_agent:handle   # → never said\n"
        'onwatch ingest a.db chat m1 \'{"text": "hello"}\'   # → stored\n```\n'
    )
    with pytest.raises(BlockFailed, match="to print 'never said'"):
        run_page(page(text), tmp_path)
