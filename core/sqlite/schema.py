"""The inbox schema, its forward migrations, and the checks that refuse foreign files."""

from __future__ import annotations

import sqlite3
import time

from ..actions import AUDIT_RENAMES
from ..clock import show
from ..errors import NotAnInbox, UpgradeRefused
from . import files

# PRAGMA application_id marks a file as an onwatch inbox ("onwt").
APPLICATION_ID = 0x6F6E7774
SQLITE_HEADER = b"SQLite format 3\x00"

EVENT_STATES_SQL = "('pending','running','done','dead','interrupted','cancelled')"

# Each entry migrates from version i to i + 1; a file at version N has run the first N.
MIGRATIONS: tuple[str, ...] = (
    # 1: the inbox.
    f"""
    CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value
    ) WITHOUT ROWID;
    INSERT INTO meta(key, value) VALUES
        ('paused', 0), ('outbox_held', 0), ('refused_writes', 0), ('takeovers', 0),
        ('last_paced_send', NULL), ('uid', lower(hex(randomblob(8))));

    CREATE TABLE settings (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        json TEXT NOT NULL
    );

    CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        source TEXT NOT NULL CHECK (length(source) > 0),
        source_id TEXT NOT NULL CHECK (length(source_id) > 0),
        payload TEXT,                    -- JSON; NULL once pruned, the key stays
        status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN {EVENT_STATES_SQL}),
        attempts INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
        claim_gen INTEGER,
        claimed_at INTEGER,
        run_id INTEGER,
        available_at INTEGER NOT NULL,
        created INTEGER NOT NULL,
        updated INTEGER NOT NULL,
        error TEXT,
        UNIQUE (source, source_id)
    );
    CREATE INDEX events_by_status ON events(status, id);
    CREATE INDEX events_pending_available ON events(available_at) WHERE status = 'pending';
    CREATE INDEX events_retried ON events(id) WHERE status = 'pending' AND attempts > 0;
    CREATE INDEX events_running ON events(claim_gen) WHERE status = 'running';

    -- Counts by state, kept by triggers so the TUI never counts a million rows.
    CREATE TABLE event_counts (
        status TEXT PRIMARY KEY CHECK (status IN {EVENT_STATES_SQL}),
        n INTEGER NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO event_counts VALUES ('pending', 0), ('running', 0), ('done', 0), ('dead', 0),
        ('interrupted', 0), ('cancelled', 0);
    CREATE TRIGGER events_counted_insert AFTER INSERT ON events BEGIN
        UPDATE event_counts SET n = n + 1 WHERE status = NEW.status;
    END;
    CREATE TRIGGER events_counted_update AFTER UPDATE OF status ON events
    WHEN OLD.status <> NEW.status BEGIN
        UPDATE event_counts SET n = n - 1 WHERE status = OLD.status;
        UPDATE event_counts SET n = n + 1 WHERE status = NEW.status;
    END;
    CREATE TRIGGER events_counted_delete AFTER DELETE ON events BEGIN
        UPDATE event_counts SET n = n - 1 WHERE status = OLD.status;
    END;

    CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        holder TEXT NOT NULL,
        gen INTEGER NOT NULL,
        event_ids TEXT NOT NULL,         -- JSON list
        claimed_at INTEGER NOT NULL,
        finished_at INTEGER,
        outcome TEXT CHECK (outcome IN ('done', 'error', 'lost')),
        result TEXT,
        error TEXT
    );
    CREATE INDEX runs_by_claim_time ON runs(claimed_at);

    CREATE TABLE lease (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        holder TEXT NOT NULL,
        gen INTEGER NOT NULL CHECK (gen >= 1),
        until INTEGER NOT NULL
    );
    CREATE TABLE lease_history (
        gen INTEGER PRIMARY KEY,
        holder TEXT NOT NULL,
        previous_holder TEXT,
        at INTEGER NOT NULL,
        how TEXT NOT NULL
    );

    CREATE TABLE timers (
        id TEXT PRIMARY KEY CHECK (length(id) > 0),
        kind TEXT NOT NULL DEFAULT 'timer' CHECK (kind IN ('timer', 'approval')),
        due INTEGER NOT NULL,
        every INTEGER CHECK (every IS NULL OR every > 0),
        catch_up TEXT NOT NULL CHECK (catch_up IN ('coalesce', 'each')),
        payload TEXT,
        key_source TEXT,
        key_id TEXT,
        last_fired INTEGER,
        last_skipped INTEGER NOT NULL DEFAULT 0,
        overflow INTEGER NOT NULL DEFAULT 0,
        CHECK ((key_source IS NULL) = (key_id IS NULL)),
        CHECK (key_source IS NULL OR every IS NULL)
    ) WITHOUT ROWID;
    CREATE INDEX timers_by_due ON timers(due, id);

    CREATE TABLE approvals (
        request_id TEXT PRIMARY KEY CHECK (length(request_id) > 0),
        action TEXT NOT NULL,
        requested INTEGER NOT NULL,
        due INTEGER NOT NULL,
        answer TEXT CHECK (answer IN ('yes', 'no', 'expired')),
        answered_at INTEGER,
        answered_by TEXT,
        run_id INTEGER
    ) WITHOUT ROWID;
    CREATE INDEX approvals_waiting ON approvals(due) WHERE answer IS NULL;

    CREATE TABLE deliveries (
        id INTEGER PRIMARY KEY,
        status TEXT NOT NULL CHECK (status IN ('sending', 'failed', 'sent', 'dead')),
        attempts INTEGER NOT NULL DEFAULT 0,
        paced INTEGER NOT NULL,
        at_most_once INTEGER NOT NULL DEFAULT 0,
        created INTEGER NOT NULL,
        retry_after INTEGER NOT NULL,    -- 'sending': another dispatcher may retry after this
        sent_at INTEGER,
        last_error TEXT
    );
    CREATE INDEX deliveries_open ON deliveries(id) WHERE status IN ('sending', 'failed');

    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY,
        body TEXT NOT NULL,
        urgent INTEGER NOT NULL DEFAULT 0 CHECK (urgent IN (0, 1)),
        created INTEGER NOT NULL,
        status TEXT NOT NULL DEFAULT 'held' CHECK (status IN ('held', 'sent', 'dead')),
        run_id INTEGER,
        delivery_id INTEGER REFERENCES deliveries(id)
    );
    CREATE INDEX outbox_by_status ON outbox(status, id);
    CREATE INDEX outbox_by_delivery ON outbox(delivery_id);

    CREATE TABLE audit (
        id INTEGER PRIMARY KEY,
        at INTEGER NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        target TEXT NOT NULL,
        before TEXT,
        after TEXT,
        applied INTEGER NOT NULL CHECK (applied IN (0, 1)),
        reason TEXT
    );
    CREATE INDEX audit_by_target ON audit(target, id);
    """,
    # 2: the effect journal (intended before an external effect, confirmed after), and an
    # index of which runs claimed which event, so an event's history is not a scan of runs.
    """
    CREATE TABLE run_events (
        event_id INTEGER NOT NULL,
        run_id INTEGER NOT NULL,
        PRIMARY KEY (event_id, run_id)
    ) WITHOUT ROWID;
    INSERT INTO run_events(event_id, run_id)
        SELECT json_each.value, runs.id FROM runs, json_each(runs.event_ids);
    CREATE TABLE effects (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL,
        name TEXT NOT NULL CHECK (length(name) > 0),
        key TEXT NOT NULL,               -- the idempotency key; a retried run reuses it
        state TEXT NOT NULL CHECK (state IN ('intended', 'confirmed', 'failed')),
        detail TEXT,
        intended_at INTEGER NOT NULL,
        settled_at INTEGER
    );
    CREATE UNIQUE INDEX effects_by_run ON effects(run_id, key);
    CREATE INDEX effects_by_key ON effects(key, id);
    CREATE INDEX approvals_answered ON approvals(answered_at) WHERE answer IS NOT NULL;
    """,
    # 3: a stored row the engine cannot process (a timer or delivery edited by hand or
    # written by another version) is set aside with its reason instead of stopping every
    # pass; effects name the event they are for, so their keys never depend on the batch.
    """
    ALTER TABLE timers ADD COLUMN broken TEXT;
    ALTER TABLE deliveries ADD COLUMN broken TEXT;
    ALTER TABLE effects ADD COLUMN event_id INTEGER;
    INSERT INTO meta(key, value) VALUES ('set_aside', 0) ON CONFLICT(key) DO NOTHING;
    """,
    # 4: the agent's traceback kept with the failed run (bounded by the Inbox API), so the
    # operator can tell which line raised without the worker's log.
    """
    ALTER TABLE runs ADD COLUMN traceback TEXT;
    """,
    # 5: the audit log names each operator action by its one name (core/actions.py), the
    # name its CLI subcommand and the desk use; older files wrote other words for some.
    AUDIT_RENAMES,
    # 6: fewer index pages per commit (each one is WAL bytes to write and fsync). The running
    # rows are few (one run's batch, plus lost claims until the next claim recovers them), so
    # events_by_status finds them as fast as a separate index that every claim and finish
    # had to update; an outbox row's delivery is NULL until a dispatch picks it, so only the
    # picked rows need an index entry (`delivery_id = ?` implies the partial index's WHERE).
    """
    DROP INDEX events_running;
    DROP INDEX outbox_by_delivery;
    CREATE INDEX outbox_by_delivery ON outbox(delivery_id) WHERE delivery_id IS NOT NULL;
    """,
    # 7: the run's transcript (ctx.log and logging during a run, bounded per run: its beginning
    # and its end, core/engine/transcripts.py), what runs spent (ctx.spend, in millionths of
    # the unit) with a running total per unit, and the dead events by when they died (a
    # partial index: written only when a row dies, so `onwatch notify` finds new deaths
    # without a scan).
    """
    CREATE TABLE transcripts (
        run_id INTEGER PRIMARY KEY,
        lines INTEGER NOT NULL,          -- lines the run logged: the seq of the next
        head_end INTEGER NOT NULL,       -- the seq after the beginning's last line
        head_chars INTEGER NOT NULL,
        head_closed INTEGER NOT NULL CHECK (head_closed IN (0, 1)),
        tail_chars INTEGER NOT NULL,
        dropped INTEGER NOT NULL,        -- lines left out between the beginning and the end
        dropped_chars INTEGER NOT NULL,
        sent_dropped_chars INTEGER NOT NULL, -- of lines the writer dropped before sending
        head_budget INTEGER NOT NULL,    -- max_transcript_chars as the run's first line found it
        tail_budget INTEGER NOT NULL,
        pruned INTEGER NOT NULL DEFAULT 0 CHECK (pruned IN (0, 1)),
        updated INTEGER NOT NULL
    );
    CREATE TABLE transcript_lines (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        at INTEGER NOT NULL,
        level TEXT NOT NULL,
        logger TEXT,
        text TEXT NOT NULL,
        fields TEXT,                     -- JSON object of ctx.log's keyword fields
        size INTEGER NOT NULL,
        UNIQUE (run_id, seq)
    );
    CREATE TABLE spend (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL,
        seq INTEGER NOT NULL,            -- its line in the run's transcript: a retry is a no-op
        at INTEGER NOT NULL,
        unit TEXT NOT NULL CHECK (length(unit) > 0),
        micros INTEGER NOT NULL CHECK (micros >= 0),
        note TEXT,
        UNIQUE (run_id, seq)
    );
    CREATE INDEX spend_by_unit ON spend(unit, at, micros);  -- a unit's window, summed in it
    CREATE TABLE spend_totals (
        unit TEXT PRIMARY KEY,
        micros INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX events_died ON events(updated) WHERE status = 'dead';
    """,
    # 8: keys no restore or copy of the file can give to another effect, and a claim whose
    # cost does not grow with the events waiting out a backoff (docs/rules.md#effects-and-
    # their-keys, #claiming-a-run). Additive only, like every migration from here on: the
    # previous release's statements, which name indexes and columns, keep working on the
    # migrated file (a process of it may still read or write while the file is upgraded).
    #
    # A random salt in each event's and each delivery's row goes into its keys. Rows stored
    # before keep NULL, and the key they always had: a retry of an effect begun before the
    # upgrade must pass the key it passed then. (An event that never ran gets its salt when
    # first claimed.) The new partial indexes hold only pending rows: fresh ones by id (what
    # a batch claims), retried ones by when they may run again and by attempts used, so a
    # claim looks only at events it can take or must bury.
    """
    ALTER TABLE events ADD COLUMN key_salt INTEGER;
    ALTER TABLE deliveries ADD COLUMN key_salt INTEGER;
    CREATE INDEX events_fresh ON events(id) WHERE status = 'pending' AND attempts = 0;
    CREATE INDEX events_retry_due ON events(available_at)
        WHERE status = 'pending' AND attempts > 0;
    CREATE INDEX events_retry_spent ON events(attempts)
        WHERE status = 'pending' AND attempts > 0;
    """,
    # 9: an operator may pause a timer: the scheduler skips it until it is
    # resumed, and a deploy that registers it again does not resume it.
    """
    ALTER TABLE timers ADD COLUMN paused INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1));
    """,
    # 10: the worker processes of this inbox, the lease holder and those
    # standing by, each with its host, pid, when it started and when it was last seen (a
    # heartbeat), so the desk can say who watches; and the approvals a run asked for, by run.
    """
    CREATE TABLE workers (
        holder TEXT PRIMARY KEY,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        started INTEGER NOT NULL,
        seen INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX approvals_by_run ON approvals(run_id) WHERE run_id IS NOT NULL;
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)


def check_file(path: str) -> bool:
    """Refuse a file that is not SQLite before SQLite touches it; return whether it exists."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        raise NotAnInbox(f"{path} is a directory, not an inbox file") from None
    except PermissionError:
        raise NotAnInbox(f"{path} cannot be read (permission denied)") from None
    except OSError as exc:  # a name too long for the file system, a path through a file, …
        raise NotAnInbox(f"{path[:200]} cannot be opened: {exc.strerror or exc}") from None
    if header and header != SQLITE_HEADER:
        raise NotAnInbox(f"{path} is not an onwatch inbox: it is not a SQLite database")
    return True


def inspect(db: sqlite3.Connection, path: str) -> int:
    """Return the file's schema version (0 for an empty file) or raise NotAnInbox."""
    # One snapshot: read piecemeal, another process's creation could commit in between and
    # an inbox would look like an empty file with someone else's tables.
    own = not db.in_transaction
    try:
        if own:
            db.execute("BEGIN")
        try:
            app_id = db.execute("PRAGMA application_id").fetchone()[0]
            version: int = db.execute("PRAGMA user_version").fetchone()[0]
            tables = [
                r[0]
                for r in db.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
                )
            ]
        finally:
            if own and db.in_transaction:
                db.execute("COMMIT")
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise  # another process holds it: busy, not foreign (core/sqlite/db.py says so)
        full = files.no_room(exc, path)  # a full disk: its index could not grow
        if full is not None:
            raise full from None
        raise NotAnInbox(f"{path} is not a usable inbox: {exc}") from None
    except sqlite3.DatabaseError as exc:
        raise NotAnInbox(f"{path} is not a usable inbox: {exc}") from None
    if app_id == 0 and not tables and version == 0:
        return 0
    if app_id != APPLICATION_ID:
        listed = ", ".join(tables[:5]) + (" …" if len(tables) > 5 else "")
        raise NotAnInbox(
            f"{path} is a SQLite database but not an onwatch inbox "
            f"(tables: {listed or 'none'}); refusing to touch it"
        )
    if version > SCHEMA_VERSION:
        raise NotAnInbox(
            f"{path} was written by a newer onwatch (schema {version}; this one knows up to "
            f"{SCHEMA_VERSION}); upgrade onwatch to open it"
        )
    return version


def migrate(
    db: sqlite3.Connection, path: str, target: int = SCHEMA_VERSION, *, now: int | None = None
) -> int:
    """Bring the file forward to `target` in one immediate transaction; return the old version.

    The version is re-read under the write lock, so two processes opening a new file at once
    cannot both create it. An existing inbox is not migrated while its lease is held
    (UpgradeRefused): the holder is a worker that did not migrate it, so of an older
    release (docs/rules.md#upgrading-a-running-deployment). `now` is the wall clock's.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        version = inspect(db, path)
        if 0 < version < target:
            refuse_under_lease(db, path, version, target, int(time.time()) if now is None else now)
        for step in range(version, target):
            for statement in _split(MIGRATIONS[step]):
                db.execute(statement)
        if version < target:
            db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            db.execute(f"PRAGMA user_version = {target}")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return version


def refuse_under_lease(
    db: sqlite3.Connection, path: str, version: int, target: int, now: int
) -> None:
    """UpgradeRefused while a worker holds the lease (a lease row edited into something that
    is not a time counts as not held: a takeover would follow anyway)."""
    row = db.execute("SELECT holder, gen, until FROM lease WHERE id = 1").fetchone()
    if row is None or type(row[2]) is not int or row[2] < now:
        return
    holder, gen, until = row
    raise UpgradeRefused(
        f"{path} is at schema {version} and was not migrated to schema {target}: its lease "
        f"is held by {show(holder)} (generation {gen}, for {until - now + 1} s more), a "
        f"worker of the release that wrote schema {version}. Stop that worker (it hands the "
        f"lease back) and every other one of that release, then run `onwatch migrate "
        f"{path}` (or start a worker of this release, which migrates)"
    )


def _split(script: str) -> list[str]:
    """Split a migration into statements (executescript would commit our transaction)."""
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            if current.strip():
                statements.append(current.strip())
            current = ""
    if current.strip():
        statements.append(current.strip())
    return statements
