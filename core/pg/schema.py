"""The PostgreSQL schema: many inboxes per database, versioned forward migrations, and the
checks that refuse a database that is not ours (or is newer) before anything is written.

Every table carries `inbox_id`; an inbox is one row of `inboxes`, which also holds what the
SQLite file keeps in `meta`, `settings` and `lease`, so creating an inbox is one insert and
the fleet listing (core/pg/summaries.py) is one walk of the small `inboxes` table.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..actions import AUDIT_RENAMES
from ..clock import show
from ..errors import InboxError, NotAnInbox, UpgradeRefused
from . import said
from .rows import Row, one

if TYPE_CHECKING:
    import psycopg

APPLICATION = "onwatch"
EVENT_STATES_SQL = "('pending','running','done','dead','interrupted','cancelled')"
# The channel on which the events' trigger tells a schema's listeners (schema 8 on): `onwatch.`
# and the md5 of the schema's name (a channel's name is at most 63 bytes, a schema's too).
# Before schema 8, every schema of a database sent on `onwatch`.
CHANNEL_OF_SCHEMA = "'onwatch.' || md5(TG_TABLE_SCHEMA)"
# Any fixed number: every process migrating the same database takes this advisory lock.
MIGRATION_LOCK = 0x6F6E7774


def _events_changed(channel: str) -> str:
    """The events' statement trigger function (after `CREATE` or `CREATE OR REPLACE`): it
    keeps event_counts, and sends NOTIFY on `channel` (an SQL expression) with the inbox's
    name for each inbox given work by the statement."""
    return f"""FUNCTION onwatch_events_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP IN ('UPDATE', 'DELETE') THEN
            UPDATE event_counts c SET n = c.n - d.k
            FROM (SELECT inbox_id, status, count(*) AS k FROM old_rows GROUP BY 1, 2) d
            WHERE c.inbox_id = d.inbox_id AND c.status = d.status;
        END IF;
        IF TG_OP IN ('UPDATE', 'INSERT') THEN
            UPDATE event_counts c SET n = c.n + d.k
            FROM (SELECT inbox_id, status, count(*) AS k FROM new_rows GROUP BY 1, 2) d
            WHERE c.inbox_id = d.inbox_id AND c.status = d.status;
        END IF;
        IF TG_OP = 'INSERT' THEN
            PERFORM pg_notify({channel}, i.name) FROM inboxes i
            WHERE i.id IN (SELECT inbox_id FROM new_rows WHERE status = 'pending');
        ELSIF TG_OP = 'UPDATE' THEN
            PERFORM pg_notify({channel}, i.name) FROM inboxes i
            WHERE i.id IN (SELECT n.inbox_id FROM new_rows n JOIN old_rows o
                           USING (inbox_id, id)
                           WHERE n.status = 'pending' AND o.status <> 'pending');
        END IF;
        RETURN NULL;
    END $$;"""


def _events_counted(channel: str) -> str:
    """The events' statement trigger function of schema 9: as _events_changed, with an
    UPDATE's counts moved by one statement of net changes (a status that loses and gains as
    many rows, as `running` in a finish that claims the next run, is not written), and the
    look for events that became pending made only when a new row is pending (a claim's and
    a finish's never are). Measured on a claim: the trigger 103 → 47 µs of the server's time
    (docs/performance.md)."""
    return f"""FUNCTION onwatch_events_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'UPDATE' THEN
            UPDATE event_counts c SET n = c.n + d.k
            FROM (SELECT inbox_id, status, sum(k) AS k
                  FROM (SELECT inbox_id, status, -1 AS k FROM old_rows
                        UNION ALL
                        SELECT inbox_id, status, 1 AS k FROM new_rows) AS moved
                  GROUP BY 1, 2 HAVING sum(k) <> 0) d
            WHERE c.inbox_id = d.inbox_id AND c.status = d.status;
            IF EXISTS (SELECT FROM new_rows WHERE status = 'pending') THEN
                PERFORM pg_notify({channel}, i.name) FROM inboxes i
                WHERE i.id IN (SELECT n.inbox_id FROM new_rows n JOIN old_rows o
                               USING (inbox_id, id)
                               WHERE n.status = 'pending' AND o.status <> 'pending');
            END IF;
        ELSIF TG_OP = 'INSERT' THEN
            UPDATE event_counts c SET n = c.n + d.k
            FROM (SELECT inbox_id, status, count(*) AS k FROM new_rows GROUP BY 1, 2) d
            WHERE c.inbox_id = d.inbox_id AND c.status = d.status;
            PERFORM pg_notify({channel}, i.name) FROM inboxes i
            WHERE i.id IN (SELECT inbox_id FROM new_rows WHERE status = 'pending');
        ELSE
            UPDATE event_counts c SET n = c.n - d.k
            FROM (SELECT inbox_id, status, count(*) AS k FROM old_rows GROUP BY 1, 2) d
            WHERE c.inbox_id = d.inbox_id AND c.status = d.status;
        END IF;
        RETURN NULL;
    END $$;"""


# Each entry migrates from version i to i + 1; a database at version N has run the first N.
MIGRATIONS: tuple[str, ...] = (
    # 1: the inboxes (the shape of SQLite schema 4, with the inbox id in every key).
    f"""
    CREATE TABLE onwatch_schema (
        id integer PRIMARY KEY CHECK (id = 1),
        application text NOT NULL CHECK (application = '{APPLICATION}'),
        version integer NOT NULL
    );
    INSERT INTO onwatch_schema VALUES (1, '{APPLICATION}', 0);

    CREATE TABLE inboxes (
        id bigserial PRIMARY KEY,
        name text NOT NULL CHECK (length(name) > 0),
        uid text NOT NULL DEFAULT md5(random()::text || clock_timestamp()::text),
        created bigint NOT NULL,
        settings text,                     -- JSON; NULL means the defaults
        paused boolean NOT NULL DEFAULT false,
        outbox_held boolean NOT NULL DEFAULT false,
        refused_writes bigint NOT NULL DEFAULT 0,
        takeovers bigint NOT NULL DEFAULT 0,
        set_aside bigint NOT NULL DEFAULT 0, -- rows the engine could not process, set aside
        last_paced_send bigint,
        changes bigint NOT NULL DEFAULT 0, -- the change token: one more per changing commit
        lease_holder text,                 -- NULL until the first acquire
        lease_gen bigint CHECK (lease_gen >= 1),
        lease_until bigint,
        released_gen bigint,               -- the generation its holder handed back, if any
        CHECK ((lease_holder IS NULL) = (lease_gen IS NULL)
               AND (lease_gen IS NULL) = (lease_until IS NULL)),
        CONSTRAINT inboxes_by_name UNIQUE (name)
    );

    -- An event's id counts within its inbox (1, 2, 3 … as in an inbox file): the next id
    -- is max + 1, safe because an inbox's writers take turns (core/pg/db.py).
    CREATE TABLE events (
        inbox_id bigint NOT NULL REFERENCES inboxes(id),
        id bigint NOT NULL CHECK (id > 0),
        source text NOT NULL CHECK (length(source) > 0),
        source_id text NOT NULL CHECK (length(source_id) > 0),
        payload text,                      -- JSON; NULL once pruned, the key stays
        status text NOT NULL DEFAULT 'pending' CHECK (status IN {EVENT_STATES_SQL}),
        attempts bigint NOT NULL DEFAULT 0 CHECK (attempts >= 0),
        claim_gen bigint,
        claimed_at bigint,
        run_id bigint,
        available_at bigint NOT NULL,
        created bigint NOT NULL,
        updated bigint NOT NULL,
        error text,
        PRIMARY KEY (inbox_id, id),
        UNIQUE (inbox_id, source, source_id)
    );
    CREATE INDEX events_by_status ON events(inbox_id, status, id);
    CREATE INDEX events_pending_available ON events(inbox_id, available_at)
        WHERE status = 'pending';
    CREATE INDEX events_retried ON events(inbox_id, id) WHERE status = 'pending' AND attempts > 0;
    CREATE INDEX events_running ON events(inbox_id, claim_gen) WHERE status = 'running';
    CREATE INDEX events_by_run ON events(inbox_id, run_id) WHERE status = 'running';

    -- Counts by state, kept by statement triggers so nobody counts a million rows.
    CREATE TABLE event_counts (
        inbox_id bigint NOT NULL REFERENCES inboxes(id),
        status text NOT NULL CHECK (status IN {EVENT_STATES_SQL}),
        n bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (inbox_id, status)
    );

    -- A commit that gives an inbox work (a new event, an answer, an expiry, a requeue)
    -- tells its listeners: NOTIFY is delivered at commit, and only if it commits.
    CREATE {_events_changed("'onwatch'")}
    CREATE TRIGGER events_counted_insert AFTER INSERT ON events
        REFERENCING NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION onwatch_events_changed();
    CREATE TRIGGER events_counted_update AFTER UPDATE ON events
        REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION onwatch_events_changed();
    CREATE TRIGGER events_counted_delete AFTER DELETE ON events
        REFERENCING OLD TABLE AS old_rows
        FOR EACH STATEMENT EXECUTE FUNCTION onwatch_events_changed();

    CREATE TABLE runs (
        id bigserial PRIMARY KEY,
        inbox_id bigint NOT NULL REFERENCES inboxes(id),
        holder text NOT NULL,
        gen bigint NOT NULL,
        event_ids text NOT NULL,           -- JSON list
        claimed_at bigint NOT NULL,
        finished_at bigint,
        outcome text CHECK (outcome IN ('done', 'error', 'lost')),
        result text,
        error text,
        traceback text                     -- the agent's, for a failed run (bounded)
    );
    CREATE INDEX runs_by_claim_time ON runs(inbox_id, claimed_at);

    CREATE TABLE run_events (
        inbox_id bigint NOT NULL REFERENCES inboxes(id),
        event_id bigint NOT NULL,
        run_id bigint NOT NULL,
        PRIMARY KEY (inbox_id, event_id, run_id)
    );

    CREATE TABLE lease_history (
        inbox_id bigint NOT NULL REFERENCES inboxes(id),
        gen bigint NOT NULL,
        holder text NOT NULL,
        previous_holder text,
        at bigint NOT NULL,
        how text NOT NULL,
        PRIMARY KEY (inbox_id, gen)
    );

    CREATE TABLE timers (
        inbox_id bigint NOT NULL REFERENCES inboxes(id),
        id text NOT NULL CHECK (length(id) > 0),
        kind text NOT NULL DEFAULT 'timer' CHECK (kind IN ('timer', 'approval')),
        due bigint NOT NULL,
        every bigint CHECK (every IS NULL OR every > 0),
        catch_up text NOT NULL CHECK (catch_up IN ('coalesce', 'each')),
        payload text,
        key_source text,
        key_id text,
        last_fired bigint,
        last_skipped bigint NOT NULL DEFAULT 0,
        overflow bigint NOT NULL DEFAULT 0,
        broken text,                       -- why the scheduler set it aside (never fires)
        CHECK ((key_source IS NULL) = (key_id IS NULL)),
        CHECK (key_source IS NULL OR every IS NULL),
        PRIMARY KEY (inbox_id, id)
    );
    CREATE INDEX timers_by_due ON timers(inbox_id, due, id);

    CREATE TABLE approvals (
        inbox_id bigint NOT NULL REFERENCES inboxes(id),
        request_id text NOT NULL CHECK (length(request_id) > 0),
        action text NOT NULL,
        requested bigint NOT NULL,
        due bigint NOT NULL,
        answer text CHECK (answer IN ('yes', 'no', 'expired')),
        answered_at bigint,
        answered_by text,
        run_id bigint,
        PRIMARY KEY (inbox_id, request_id)
    );
    CREATE INDEX approvals_waiting ON approvals(inbox_id, due) WHERE answer IS NULL;
    CREATE INDEX approvals_answered ON approvals(inbox_id, answered_at)
        WHERE answer IS NOT NULL;

    CREATE TABLE deliveries (
        id bigserial PRIMARY KEY,
        inbox_id bigint NOT NULL REFERENCES inboxes(id),
        status text NOT NULL CHECK (status IN ('sending', 'failed', 'sent', 'dead')),
        attempts bigint NOT NULL DEFAULT 0,
        paced boolean NOT NULL,
        at_most_once boolean NOT NULL DEFAULT false,
        created bigint NOT NULL,
        retry_after bigint NOT NULL,       -- 'sending': another dispatcher may retry after this
        sent_at bigint,
        last_error text,
        broken text                        -- why it was set aside, not sent
    );
    CREATE INDEX deliveries_by_inbox ON deliveries(inbox_id, id);
    CREATE INDEX deliveries_open ON deliveries(inbox_id, id) WHERE status IN ('sending', 'failed');

    CREATE TABLE outbox (
        id bigserial PRIMARY KEY,
        inbox_id bigint NOT NULL REFERENCES inboxes(id),
        body text NOT NULL,
        urgent boolean NOT NULL DEFAULT false,
        created bigint NOT NULL,
        status text NOT NULL DEFAULT 'held' CHECK (status IN ('held', 'sent', 'dead')),
        run_id bigint,
        delivery_id bigint REFERENCES deliveries(id)
    );
    CREATE INDEX outbox_by_status ON outbox(inbox_id, status, id);
    CREATE INDEX outbox_by_delivery ON outbox(inbox_id, delivery_id);

    CREATE TABLE audit (
        id bigserial PRIMARY KEY,
        inbox_id bigint NOT NULL REFERENCES inboxes(id),
        at bigint NOT NULL,
        actor text NOT NULL,
        action text NOT NULL,
        target text NOT NULL,
        before text,
        after text,
        applied boolean NOT NULL,
        reason text
    );
    CREATE INDEX audit_by_inbox ON audit(inbox_id, id);
    CREATE INDEX audit_by_target ON audit(inbox_id, target, id);

    CREATE TABLE effects (
        id bigserial PRIMARY KEY,
        inbox_id bigint NOT NULL REFERENCES inboxes(id),
        run_id bigint NOT NULL,
        name text NOT NULL CHECK (length(name) > 0),
        key text NOT NULL,                 -- the idempotency key; a retried run reuses it
        state text NOT NULL CHECK (state IN ('intended', 'confirmed', 'failed')),
        detail text,
        intended_at bigint NOT NULL,
        settled_at bigint,
        event_id bigint                    -- the event the effect is for (its key names it)
    );
    CREATE UNIQUE INDEX effects_by_run ON effects(inbox_id, run_id, key);
    CREATE INDEX effects_by_key ON effects(inbox_id, key, id);
    """,
    # 2: the audit log names each operator action by its one name (core/actions.py); older
    # databases wrote other words for some (the same rewrite as SQLite schema 5).
    AUDIT_RENAMES,
    # 3: the run's transcript, what runs spent with a running total per unit, and the dead
    # events by when they died (the same as SQLite's migration of them).
    """
    CREATE TABLE transcripts (
        inbox_id bigint NOT NULL REFERENCES inboxes(id),
        run_id bigint NOT NULL,
        lines bigint NOT NULL,             -- lines the run logged: the seq of the next
        head_end bigint NOT NULL,          -- the seq after the beginning's last line
        head_chars bigint NOT NULL,
        head_closed boolean NOT NULL,
        tail_chars bigint NOT NULL,
        dropped bigint NOT NULL,           -- lines left out between the beginning and the end
        dropped_chars bigint NOT NULL,
        sent_dropped_chars bigint NOT NULL, -- of lines the writer dropped before sending
        head_budget bigint NOT NULL,       -- max_transcript_chars as the first line found it
        tail_budget bigint NOT NULL,
        pruned boolean NOT NULL DEFAULT false,
        updated bigint NOT NULL,
        PRIMARY KEY (inbox_id, run_id)
    );
    CREATE TABLE transcript_lines (
        inbox_id bigint NOT NULL REFERENCES inboxes(id),
        run_id bigint NOT NULL,
        seq bigint NOT NULL,
        at bigint NOT NULL,
        level text NOT NULL,
        logger text,
        text text NOT NULL,
        fields text,                       -- JSON object of ctx.log's keyword fields
        size bigint NOT NULL,
        PRIMARY KEY (inbox_id, run_id, seq)
    );
    CREATE TABLE spend (
        id bigserial PRIMARY KEY,
        inbox_id bigint NOT NULL REFERENCES inboxes(id),
        run_id bigint NOT NULL,
        seq bigint NOT NULL,               -- its line in the run's transcript
        at bigint NOT NULL,
        unit text NOT NULL CHECK (length(unit) > 0),
        micros bigint NOT NULL CHECK (micros >= 0),
        note text,
        UNIQUE (inbox_id, run_id, seq)
    );
    CREATE INDEX spend_by_time ON spend(inbox_id, at, unit);
    CREATE TABLE spend_totals (
        inbox_id bigint NOT NULL REFERENCES inboxes(id),
        unit text NOT NULL,
        micros numeric NOT NULL,
        PRIMARY KEY (inbox_id, unit)
    );
    CREATE INDEX events_died ON events(inbox_id, updated) WHERE status = 'dead';
    """,
    # 4: what SQLite schema 8 adds, for the same reasons (see core/sqlite/schema.py): a key
    # salt in each event's and delivery's row, and the claim's partial indexes. Additive
    # only: the previous release's statements keep working on the migrated database. The
    # salt's default is set apart from the column: rows stored before keep NULL (and their
    # keys), every row inserted from now on draws one, whichever release inserts it.
    """
    ALTER TABLE events ADD COLUMN key_salt bigint;
    ALTER TABLE events ALTER COLUMN key_salt SET DEFAULT floor(random() * 9007199254740992);
    ALTER TABLE deliveries ADD COLUMN key_salt bigint;
    ALTER TABLE deliveries ALTER COLUMN key_salt
        SET DEFAULT floor(random() * 9007199254740992);
    CREATE INDEX events_fresh ON events(inbox_id, id) WHERE status = 'pending' AND attempts = 0;
    CREATE INDEX events_retry_due ON events(inbox_id, available_at)
        WHERE status = 'pending' AND attempts > 0;
    CREATE INDEX events_retry_spent ON events(inbox_id, attempts)
        WHERE status = 'pending' AND attempts > 0;
    """,
    # 5: an operator may pause a timer: the scheduler skips it until it is
    # resumed, and a deploy that registers it again does not resume it.
    """
    ALTER TABLE timers ADD COLUMN paused boolean NOT NULL DEFAULT false;
    """,
    # 6: the worker processes of each inbox, the lease holder and those
    # standing by, with host, pid, start and last heartbeat; and approvals by run.
    """
    CREATE TABLE workers (
        inbox_id bigint NOT NULL REFERENCES inboxes(id),
        holder text NOT NULL,
        host text NOT NULL,
        pid bigint NOT NULL,
        started bigint NOT NULL,
        seen bigint NOT NULL,
        PRIMARY KEY (inbox_id, holder)
    );
    CREATE INDEX approvals_by_run ON approvals(inbox_id, run_id) WHERE run_id IS NOT NULL;
    """,
    # 7: a batch of events stored in one round trip (queries.sql `events_insert_alone`): the
    # inbox's row locked, then the rows inserted as `events_insert` inserts them, by a
    # statement that sees every commit made before the lock was granted (one SQL statement
    # cannot: its snapshot is taken before its lock). NULL when the stored settings are no
    # longer `settings` (the caller's write transaction decides); else the positions (from
    # 1) of the items it stored. The text is this migration's own: a later change to
    # `events_insert` comes with a migration of its own.
    # And the foreign key of events to inboxes goes: a query per row inserted (run by the
    # key's trigger: a fifth of a batch's server time), checking what every insert already
    # holds, the inbox's row lock. What it also guarded is kept by a trigger that costs an
    # insert nothing: an inbox's row is not deleted, nor its id changed, while it has events
    # (no onwatch statement does either; a person's DELETE is refused, as the key refused it).
    """
    ALTER TABLE events DROP CONSTRAINT events_inbox_id_fkey;
    CREATE FUNCTION onwatch_inbox_kept() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF (TG_OP = 'DELETE' OR NEW.id IS DISTINCT FROM OLD.id)
           AND EXISTS (SELECT FROM events WHERE inbox_id = OLD.id) THEN
            RAISE EXCEPTION 'inbox % still has events: an inbox is never deleted', OLD.name
                USING ERRCODE = 'foreign_key_violation';
        END IF;
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END $$;
    CREATE TRIGGER inboxes_keep_their_events BEFORE DELETE OR UPDATE OF id ON inboxes
        FOR EACH ROW EXECUTE FUNCTION onwatch_inbox_kept();
    CREATE FUNCTION onwatch_ingest_many(inbox bigint, settings text, sources text[],
                                        source_ids text[], payloads text[], nows bigint[])
    RETURNS integer[] LANGUAGE plpgsql AS $$
    #variable_conflict use_variable
    DECLARE
        now bigint;
        stored integer[];
    BEGIN
        PERFORM FROM inboxes i
        WHERE i.id = inbox AND i.settings IS NOT DISTINCT FROM onwatch_ingest_many.settings
        FOR UPDATE;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        now := floor(extract(epoch FROM clock_timestamp()))::bigint;  -- after the lock
        WITH fresh AS MATERIALIZED (
            SELECT last.id + row_number() OVER (ORDER BY k.o) AS id, k.s, k.i, k.p,
                   coalesce(k.n, now) AS n, k.o
            FROM (SELECT DISTINCT ON (s, i) s, i, p, n, o
                  FROM unnest(sources, source_ids, payloads, nows)
                       WITH ORDINALITY AS u(s, i, p, n, o)
                  ORDER BY s, i, o) AS k
            CROSS JOIN (SELECT coalesce(max(e.id), 0) AS id FROM events e
                        WHERE e.inbox_id = inbox) AS last
            LEFT JOIN LATERAL (SELECT true AS stored FROM events e
                               WHERE e.inbox_id = inbox AND e.source = k.s
                                 AND e.source_id = k.i
                               LIMIT 1) AS seen ON true
            WHERE seen.stored IS NULL
        ), kept AS (
            INSERT INTO events(inbox_id, id, source, source_id, payload, available_at,
                               created, updated)
            SELECT inbox, f.id, f.s, f.i, f.p, f.n, f.n, f.n FROM fresh AS f
        )
        SELECT coalesce(array_agg(f.o::integer ORDER BY f.o), '{}') INTO stored FROM fresh AS f;
        IF cardinality(stored) > 0 THEN
            UPDATE inboxes i SET changes = i.changes + 1 WHERE i.id = inbox;
        END IF;
        RETURN stored;
    END $$;
    """,
    # 8: each schema's notifications on a channel of its own (CHANNEL_OF_SCHEMA): the
    # listeners of one schema no longer wake for another's events (an idle fleet worker
    # looked once for each NOTIFY of a busy schema beside it). A listener of this release
    # listens on both channels, so it hears a database of schema 7 too, and one migrated
    # under it; a listener of the previous release hears nothing more and polls.
    f"CREATE OR REPLACE {_events_changed(CHANNEL_OF_SCHEMA)}",
    # 9: the events' trigger counts an UPDATE's changes in one statement, and looks for
    # events that became pending only when one may have (_events_counted): the same counts
    # and notifications for a fraction of the server's time on every claim and finish.
    f"CREATE OR REPLACE {_events_counted(CHANNEL_OF_SCHEMA)}",
)

SCHEMA_VERSION = len(MIGRATIONS)
TABLES = tuple(dict.fromkeys(re.findall(r"CREATE TABLE (\w+)", "".join(MIGRATIONS))))


# Whether onwatch_schema is found; its schema; and any of onwatch's table names the
# search_path finds in another schema (onwatch's statements name their tables without a
# schema: a table of another application earlier in the path would be the one they used).
_FOUND = """
SELECT o.oid IS NOT NULL, o.nspname, array(
    SELECT format('%%s (in %%s)', t, n.nspname)
    FROM unnest(%(tables)s::text[]) AS t
    JOIN pg_class c ON c.oid = to_regclass(t)
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE o.oid IS NOT NULL AND c.relnamespace <> o.relnamespace ORDER BY t)
FROM (SELECT to_regclass('onwatch_schema') AS oid) AS r
LEFT JOIN LATERAL (
    SELECT c.oid, c.relnamespace, n.nspname FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = r.oid) AS o ON true
"""


def inspect(conn: psycopg.Connection[Row], where: str) -> int:
    """Return the database's schema version (0 for a database with no tables of its own) or
    raise NotAnInbox: tables of someone else, or a newer onwatch."""
    row = one(conn.execute(_FOUND, {"tables": list(TABLES)}))
    if not row[0]:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema() ORDER BY table_name LIMIT 6"
            )
        ]
        if not tables:
            return 0
        listed = ", ".join(tables[:5]) + (" …" if len(tables) > 5 else "")
        raise NotAnInbox(
            f"{where} is a PostgreSQL database but not an onwatch database "
            f"(tables: {listed}); refusing to touch it"
        )
    if row[2]:
        raise NotAnInbox(
            f"{where}: the search_path finds {', '.join(row[2])} before onwatch's own, in "
            f"schema {row[1]}; onwatch's statements would use them. Put {row[1]} first "
            f"(?options=-csearch_path%3D{row[1]} in the URL, or ALTER ROLE … SET search_path)"
        )
    application, version = one(
        conn.execute("SELECT application, version FROM onwatch_schema WHERE id = 1")
    )
    if application != APPLICATION:  # pragma: no cover - the CHECK forbids it
        raise NotAnInbox(f"{where} is not an onwatch database")
    if version > SCHEMA_VERSION:
        raise NotAnInbox(
            f"{where} was written by a newer onwatch (schema {version}; this one knows up to "
            f"{SCHEMA_VERSION}); upgrade onwatch to open it"
        )
    return int(version)


def migrate(
    conn: psycopg.Connection[Row], where: str, target: int = SCHEMA_VERSION, create: bool = True
) -> int:
    """Bring the database forward to `target` in one transaction; return the old version
    (0 with create=False: an empty database stays empty).

    The version is re-read under an advisory lock, so two processes opening a new database
    at once cannot both create it, and a foreign database is told apart from one being
    created meanwhile; DDL is transactional, so a failed step leaves nothing.
    """
    # The lock is the session's, taken before the transaction begins: a transaction that
    # begins after another's commit reads the catalogue as that commit left it, where one
    # that waited for a lock inside itself may still see the catalogue from before (its
    # catalogue snapshot is not renewed by an advisory lock), and call a database being
    # created meanwhile foreign.
    from psycopg import errors as psycopg_errors

    conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
    try:
        with conn.transaction():
            version = inspect(conn, where)
            if version == 0 and not create:
                return 0
            if 0 < version < target:
                refuse_under_lease(conn, where, version, target)
            try:
                for step in range(version, target):
                    conn.execute(MIGRATIONS[step])
            except psycopg_errors.InsufficientPrivilege as exc:
                raise InboxError(_not_allowed(where, version, target, said(exc))) from None
            if version < target:
                conn.execute("UPDATE onwatch_schema SET version = %s WHERE id = 1", (target,))
    finally:
        if not conn.broken:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
    return version


def _not_allowed(where: str, version: int, target: int, why: str) -> str:
    """Why the role could not create or migrate the schema, and what to do about it."""
    if version == 0:
        return (
            f"cannot create onwatch's tables in {where}: {why}; grant the role CREATE on "
            f"that schema (PostgreSQL 15 and later give it to the database's owner only), "
            f"or point the URL's search_path at a schema the role may create in "
            f"(?options=-csearch_path%3DNAME)"
        )
    return (
        f"cannot migrate {where} from schema {version} to {target}: {why}; migrate as "
        f"the role that owns onwatch's tables (`onwatch migrate URL`)"
    )


def refuse_under_lease(
    conn: psycopg.Connection[Row], where: str, version: int, target: int
) -> None:
    """UpgradeRefused while any inbox's lease is held (by the server's clock): its holder is
    a worker that did not migrate the database, so of an older release."""
    held = conn.execute(
        "SELECT name, lease_holder, lease_gen, "
        "lease_until - floor(extract(epoch FROM clock_timestamp()))::bigint + 1 "
        "FROM inboxes WHERE lease_until >= floor(extract(epoch FROM clock_timestamp())) "
        "ORDER BY name LIMIT 4"
    ).fetchall()
    if not held:
        return
    named = ", ".join(
        f"inbox {show(n)} by {show(h)} (generation {g}, for {left} s more)"
        for n, h, g, left in held[:3]
    )
    raise UpgradeRefused(
        f"{where} is at schema {version} and was not migrated to schema {target}: leases are "
        f"held by workers of the release that wrote schema {version}: {named}"
        f"{' and more' if len(held) > 3 else ''}. Stop every worker of that release (each "
        f"hands its lease back), then run `onwatch migrate {where}` (or start a worker of "
        f"this release, which migrates)"
    )
