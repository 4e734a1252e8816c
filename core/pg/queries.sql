-- The named statements of a PostgreSQL inbox (core/engine/queries.py reads them).
--
-- One database holds many inboxes: every statement is scoped to %(inbox)s, which
-- core/pg/tx.py adds to every call. Parameters are psycopg's named ones; a list parameter
-- is an array. The names and what each statement means are core/sqlite/queries.sql's.
-- What an inbox file keeps in `meta`, `settings` and `lease` is columns of the inbox's row
-- here. An event's id counts within its inbox (max + 1: an inbox's writers take turns,
-- each holding the inbox's row lock, see core/pg/db.py). `-- name: NAME before N` keeps a
-- statement's former text for a database of a schema older than N, opened without
-- migrating (core/engine/queries.py).

-- --- settings and switches ---------------------------------------------------------------

-- name: settings_load
SELECT settings FROM inboxes WHERE id = %(inbox)s;

-- name: settings_store
UPDATE inboxes SET settings = %(json)s WHERE id = %(inbox)s;

-- name: inbox_state
SELECT lease_holder, lease_gen, lease_until, settings, paused FROM inboxes
WHERE id = %(inbox)s;

-- name: audit_insert
INSERT INTO audit(inbox_id, at, actor, action, target, before, after, applied, reason)
VALUES (%(inbox)s, %(at)s, %(actor)s, %(action)s, %(target)s, %(before)s, %(after)s,
        %(applied)s, %(reason)s);

-- --- intake ------------------------------------------------------------------------------

-- A lone new event in one autocommit statement (core/engine/intake.py `ingest_alone`): it
-- locks the inbox's row as a write transaction does, stores the event only while the
-- settings are still the ones the caller checked against, and counts the change. Its id is
-- the last id + 1 as of the statement's snapshot, which was taken before the lock: a writer
-- that committed in between makes that id (or the key) conflict, and the statement then
-- stores nothing and changes nothing (the caller's transaction decides). `now` NULL: the
-- server's clock, read once the lock is held.
-- name: event_insert_alone
WITH locked AS (
    SELECT id FROM inboxes
    WHERE id = %(inbox)s AND settings IS NOT DISTINCT FROM %(settings)s::text
    FOR UPDATE
), stored AS (
    INSERT INTO events(inbox_id, id, source, source_id, payload, available_at, created,
                       updated)
    SELECT l.id, (SELECT coalesce(max(id), 0) + 1 FROM events WHERE inbox_id = %(inbox)s),
           %(source)s::text, %(source_id)s::text, %(payload)s::text, t.now, t.now, t.now
    FROM locked AS l,  -- t names l: the clock is read per locked row, so after the lock
         LATERAL (SELECT l.id, coalesce(%(now)s::bigint,
                                        floor(extract(epoch FROM clock_timestamp()))::bigint)
                  AS now) AS t
    ON CONFLICT DO NOTHING
    RETURNING 1
)
UPDATE inboxes SET changes = changes + 1
WHERE id = %(inbox)s AND EXISTS (SELECT FROM stored);

-- Many new events in one statement, numbered on from the inbox's last id in the order
-- given; a key already stored, or repeated in the arrays, is a duplicate of its first copy.
-- Each key is looked up in the key's index (a lateral probe, LIMIT 1): as NOT EXISTS, the
-- planner may join the keys against all the inbox's events, a sort of every one of them at
-- each ingest while the table has no statistics.
-- name: events_insert
INSERT INTO events(inbox_id, id, source, source_id, payload, available_at, created, updated)
SELECT %(inbox)s, last.id + row_number() OVER (ORDER BY k.o), k.s, k.i, k.p, k.n, k.n, k.n
FROM (SELECT DISTINCT ON (s, i) s, i, p, n, o
      FROM unnest(%(sources)b::text[], %(source_ids)b::text[], %(payloads)b::text[],
                  %(nows)b::bigint[]) WITH ORDINALITY AS u(s, i, p, n, o)
      ORDER BY s, i, o) AS k
CROSS JOIN (SELECT coalesce(max(id), 0) AS id FROM events WHERE inbox_id = %(inbox)s) AS last
LEFT JOIN LATERAL (SELECT true AS stored FROM events e
                   WHERE e.inbox_id = %(inbox)s AND e.source = k.s AND e.source_id = k.i
                   LIMIT 1) AS seen ON true
WHERE seen.stored IS NULL
ORDER BY k.o
RETURNING source, source_id;

-- A batch of new events in one round trip (core/engine/intake.py `ingest_batch_alone`): the
-- server function of schema 7 locks the inbox's row, stores the batch as `events_insert`
-- does, and counts the change. NULL: the settings changed since the caller read them, or
-- the schema has no such function (the caller's write transaction decides); else the
-- positions (from 1) of the items stored. `nows` NULL: the server's clock, read once the
-- lock is held.
-- name: events_insert_alone
SELECT onwatch_ingest_many(%(inbox)s, %(settings)s::text, %(sources)b::text[],
                           %(source_ids)b::text[], %(payloads)b::text[], %(nows)b::bigint[])

-- name: events_insert_alone before 7
SELECT NULL::integer[]

-- name: pending_count
SELECT n FROM event_counts WHERE inbox_id = %(inbox)s AND status = 'pending';

-- name: event_key
SELECT 1 FROM events
WHERE inbox_id = %(inbox)s AND source = %(source)s AND source_id = %(source_id)s;

-- name: events_prune
UPDATE events SET payload = NULL, updated = %(now)s
WHERE inbox_id = %(inbox)s AND status IN ('done', 'cancelled')
  AND updated < %(older_than)s AND payload IS NOT NULL;

-- --- lease -------------------------------------------------------------------------------

-- name: lease_first
UPDATE inboxes SET lease_holder = %(holder)s, lease_gen = 1, lease_until = %(until)s
WHERE id = %(inbox)s;

-- name: lease_extend
UPDATE inboxes SET lease_until = %(until)s WHERE id = %(inbox)s;

-- name: lease_take
UPDATE inboxes SET lease_holder = %(holder)s, lease_gen = %(gen)s, lease_until = %(until)s
WHERE id = %(inbox)s;

-- A holder handing its live generation back, as one autocommit statement (`lease.release`
-- decided in a write transaction: four round trips). The inbox's row is locked first, and
-- `now` (NULL: the server's clock) read once the lock is held, as a write transaction
-- orders them; the lease is in that row, so the decision reads it as it is. It writes
-- nothing when the generation does not hold: the write transaction then answers.
-- name: lease_release_alone
WITH locked AS (
    SELECT id, lease_holder, lease_gen, lease_until FROM inboxes
    WHERE id = %(inbox)s FOR UPDATE
), t AS (
    SELECT l.*, coalesce(%(now)s::bigint, floor(extract(epoch FROM clock_timestamp()))::bigint)
           AS now
    FROM locked AS l
)
UPDATE inboxes AS i
SET lease_until = t.now - 1, released_gen = t.lease_gen, changes = i.changes + 1
FROM t
WHERE i.id = t.id AND t.lease_holder = %(holder)s AND t.lease_gen = %(gen)s
  AND t.lease_until >= t.now;

-- name: lease_history_insert
INSERT INTO lease_history(inbox_id, gen, holder, previous_holder, at, how)
VALUES (%(inbox)s, %(gen)s, %(holder)s, %(previous)s, %(at)s, %(how)s);

-- name: lease_history_last_gen
SELECT coalesce(max(gen), 0) FROM lease_history WHERE inbox_id = %(inbox)s;

-- --- claiming ----------------------------------------------------------------------------

-- name: overdue_claims
SELECT id, source, claim_gen, run_id FROM events
WHERE inbox_id = %(inbox)s AND status = 'running' AND claim_gen = %(gen)s
  AND claimed_at < %(before)s;

-- name: event_interrupt
UPDATE events SET status = 'interrupted', error = %(error)s, updated = %(now)s
WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- Not backed off: the lease expiry already delayed it.
-- name: event_requeue_lost
UPDATE events SET status = 'pending', available_at = %(now)s, error = %(error)s,
       updated = %(now)s
WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- name: run_lost
UPDATE runs SET outcome = 'lost', finished_at = %(now)s, error = %(error)s
WHERE inbox_id = %(inbox)s AND id = %(id)s AND outcome IS NULL;

-- name: bury_exhausted
UPDATE events SET status = 'dead', updated = %(now)s,
    error = 'too many attempts (' || attempts || '/' || %(max_attempts)s::bigint || ')'
            || coalesce(': ' || error, '')
WHERE inbox_id = %(inbox)s AND status = 'pending' AND attempts > 0
  AND attempts >= %(max_attempts)s;

-- name: runs_since
SELECT count(*) FROM runs WHERE inbox_id = %(inbox)s AND claimed_at > %(since)s;

-- A claim's look, in one statement (one round trip where it was three): what the next run
-- may take, the claims lost by an older generation, and whether any pending event is out of
-- attempts. Tagged in the last column:
--   1: the oldest retried event whose backoff is over and that has attempts left (a retried
--      one, if any, runs alone: core/engine/runs.py). `id + 0`: no index gives this order,
--      so the planner takes the range of events_retry_due (those whose backoff is over)
--      rather than walking every retried event by id, which is what it would do while its
--      statistics still say that most of them may run;
--   0: the oldest never-attempted events that may run now (events_fresh holds them, by id);
--   2: a claim lost by an older generation (id, source, claim_gen and run_id in columns 0,
--      1, 6 and 12);
--   3: 1 if any pending event is out of attempts, else 0 (column 0; events_retry_spent
--      answers it). Only then does the claim bury them (bury_exhausted: an UPDATE, which
--      runs the events table's statement triggers even when it changes nothing).
-- A claim that finds lost claims recovers them, buries, and looks again (core/engine/runs.py).
-- (The typed parts come first: a UNION resolves its types pair by pair, and two untyped
-- NULLs would make a column text.)
-- name: claim_look
(SELECT id, source, source_id, payload, status, attempts, claim_gen, error, created, updated,
       available_at, claimed_at, run_id, 1
 FROM events
 WHERE inbox_id = %(inbox)s AND status = 'pending' AND attempts > 0
   AND attempts < %(max_attempts)s AND available_at <= %(now)s
 ORDER BY id + 0 LIMIT 1)
UNION ALL
(SELECT id, source, source_id, payload, status, attempts, claim_gen, error, created, updated,
       available_at, claimed_at, run_id, 0
 FROM events
 WHERE inbox_id = %(inbox)s AND status = 'pending' AND attempts = 0
   AND available_at <= %(now)s
 ORDER BY id LIMIT %(limit)s)
UNION ALL
(SELECT id, source, NULL, NULL, NULL, NULL, claim_gen, NULL, NULL, NULL, NULL, NULL, run_id, 2
 FROM events
 WHERE inbox_id = %(inbox)s AND status = 'running' AND claim_gen < %(gen)s)
UNION ALL
(SELECT count(*), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 3
 FROM (SELECT 1 FROM events
       WHERE inbox_id = %(inbox)s AND status = 'pending' AND attempts > 0
         AND attempts >= %(max_attempts)s
       LIMIT 1) AS spent);

-- name: event_set_aside
UPDATE events SET status = 'dead', error = %(error)s, updated = %(now)s
WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- The run, its events' links and the claim itself in one statement (one round trip).
-- Attempts are counted here, at claim time: a worker that crashes never reports failure.
-- name: claim
WITH run AS (
    INSERT INTO runs(inbox_id, holder, gen, event_ids, claimed_at)
    VALUES (%(inbox)s, %(holder)s, %(gen)s, %(json)s, %(now)s) RETURNING id),
linked AS (
    INSERT INTO run_events(inbox_id, event_id, run_id)
    SELECT %(inbox)s, unnest(%(ids)b::bigint[]), run.id FROM run),
claimed AS (
    UPDATE events SET status = 'running', attempts = attempts + 1, claim_gen = %(gen)s,
           claimed_at = %(now)s, run_id = (SELECT id FROM run), updated = %(now)s,
           key_salt = coalesce(key_salt, CASE WHEN run_id IS NULL
                                         THEN floor(random() * 9007199254740992)::bigint
                                         END)
    WHERE inbox_id = %(inbox)s AND id = ANY(%(ids)b::bigint[]))
SELECT id FROM run;

-- name: claim before 4
WITH run AS (
    INSERT INTO runs(inbox_id, holder, gen, event_ids, claimed_at)
    VALUES (%(inbox)s, %(holder)s, %(gen)s, %(json)s, %(now)s) RETURNING id),
linked AS (
    INSERT INTO run_events(inbox_id, event_id, run_id)
    SELECT %(inbox)s, unnest(%(ids)b::bigint[]), run.id FROM run),
claimed AS (
    UPDATE events SET status = 'running', attempts = attempts + 1, claim_gen = %(gen)s,
           claimed_at = %(now)s, run_id = (SELECT id FROM run), updated = %(now)s
    WHERE inbox_id = %(inbox)s AND id = ANY(%(ids)b::bigint[]))
SELECT id FROM run;

-- --- finishing ---------------------------------------------------------------------------

-- name: run_open
SELECT event_ids FROM runs
WHERE inbox_id = %(inbox)s AND id = %(id)s AND gen = %(gen)s AND outcome IS NULL;

-- name: run_outcome
SELECT gen, outcome FROM runs WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- name: events_finish_done
UPDATE events SET status = 'done', error = NULL, updated = %(now)s
WHERE inbox_id = %(inbox)s AND id = ANY(%(ids)b::bigint[]) AND status = 'running'
  AND claim_gen = %(gen)s AND (%(run)s::bigint IS NULL OR run_id = %(run)s)
RETURNING id, attempts, run_id;

-- A run's successful finish, in one statement (one round trip where it was three): the run's
-- generation and outcome (run_outcome, tagged 11: gen in column 0, outcome in column 4),
-- its events marked done (events_finish_done, tagged 10: id, attempts in column 5, run_id in
-- column 12) only while it is this generation's open run, and the run closed (runs_close)
-- once none of its events is still running. Its parts read the rows as they were before it:
-- the run's events it marks done are left out of the last check. Its rows have claim_look's
-- columns: a finish that claims next reads that look in this same statement, its rows
-- ahead of these (core/pg/tx.py `FINISH_THEN_LOOK`).
-- name: finish_done
WITH known AS (
    SELECT gen, outcome FROM runs WHERE inbox_id = %(inbox)s AND id = %(run)s
),
done AS (
    UPDATE events SET status = 'done', error = NULL, updated = %(now)s
    WHERE inbox_id = %(inbox)s AND id = ANY(%(ids)b::bigint[]) AND status = 'running'
      AND claim_gen = %(gen)s AND run_id = %(run)s
      AND EXISTS (SELECT 1 FROM known WHERE gen = %(gen)s AND outcome IS NULL)
    RETURNING id, attempts, run_id
),
closed AS (
    UPDATE runs r SET outcome = 'done', finished_at = %(now)s, result = %(result)s,
           error = NULL, traceback = %(traceback)s
    WHERE r.inbox_id = %(inbox)s AND r.id = %(run)s AND r.outcome IS NULL
      AND EXISTS (SELECT 1 FROM done)
      AND NOT EXISTS (SELECT 1 FROM events e WHERE e.inbox_id = r.inbox_id
                      AND e.run_id = r.id AND e.status = 'running'
                      AND e.id NOT IN (SELECT id FROM done))
)
(SELECT id, NULL, NULL, NULL, NULL, attempts, NULL, NULL, NULL, NULL, NULL, NULL, run_id, 10
 FROM done ORDER BY id)
UNION ALL
(SELECT gen, NULL, NULL, NULL, outcome, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 11
 FROM known);

-- name: events_still_claimed
SELECT id, attempts, run_id FROM events
WHERE inbox_id = %(inbox)s AND id = ANY(%(ids)b::bigint[]) AND status = 'running'
  AND claim_gen = %(gen)s AND (%(run)s::bigint IS NULL OR run_id = %(run)s)
ORDER BY id;

-- name: outbox_insert
INSERT INTO outbox(inbox_id, body, urgent, created, run_id)
VALUES (%(inbox)s, %(body)s, %(urgent)s, %(now)s, %(run)s);

-- name: event_bury
UPDATE events SET status = 'dead', error = %(error)s, updated = %(now)s
WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- name: event_retry_later
UPDATE events SET status = 'pending', error = %(error)s, available_at = %(available_at)s,
       updated = %(now)s
WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- A run closes when its last event is finished (a run may be finished in parts).
-- name: runs_close
UPDATE runs r SET outcome = %(outcome)s, finished_at = %(now)s, result = %(result)s,
       error = %(error)s, traceback = %(traceback)s
WHERE r.inbox_id = %(inbox)s AND r.id = ANY(%(runs)b::bigint[]) AND r.outcome IS NULL
  AND NOT EXISTS (SELECT 1 FROM events e WHERE e.inbox_id = r.inbox_id
                  AND e.run_id = r.id AND e.status = 'running');

-- --- timers ------------------------------------------------------------------------------

-- name: timer_upsert
INSERT INTO timers(inbox_id, id, kind, due, every, catch_up, payload, key_source, key_id)
VALUES (%(inbox)s, %(id)s, %(kind)s, %(due)s, %(every)s, %(catch_up)s, %(payload)s,
        %(key_source)s, %(key_id)s)
ON CONFLICT (inbox_id, id) DO UPDATE SET kind = excluded.kind, due = excluded.due,
    every = excluded.every, catch_up = excluded.catch_up, payload = excluded.payload,
    key_source = excluded.key_source, key_id = excluded.key_id, broken = NULL;

-- name: timers_delete
DELETE FROM timers WHERE inbox_id = %(inbox)s AND id = ANY(%(ids)b::text[]);

-- name: timer_due_any
SELECT 1 FROM timers
WHERE inbox_id = %(inbox)s AND due <= %(now)s AND broken IS NULL AND NOT paused LIMIT 1;

-- The last column would say the payload is proven JSON; the engine decodes it here.
-- name: timers_due
SELECT id, due, every, catch_up, payload, key_source, key_id, last_fired, last_skipped,
       overflow, kind, broken, NULL
FROM timers WHERE inbox_id = %(inbox)s AND due <= %(now)s AND broken IS NULL AND NOT paused
ORDER BY due, id LIMIT %(limit)s;

-- name: timers_advance
UPDATE timers t SET due = u.due, last_fired = coalesce(u.fired, t.last_fired),
       last_skipped = coalesce(u.skipped, t.last_skipped), overflow = t.overflow + u.overflow
FROM unnest(%(ids)b::text[], %(dues)b::bigint[], %(fired)b::bigint[],
            %(skipped)b::bigint[], %(overflows)b::bigint[])
     AS u(id, due, fired, skipped, overflow)
WHERE t.inbox_id = %(inbox)s AND t.id = u.id;

-- name: timer_set_aside
UPDATE timers SET broken = %(why)s WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- (The column is bigint: no due can be text here.)
-- name: timer_next_due
SELECT min(due) FROM timers WHERE inbox_id = %(inbox)s AND broken IS NULL AND NOT paused;

-- --- approvals ---------------------------------------------------------------------------

-- name: approval_insert
INSERT INTO approvals(inbox_id, request_id, action, requested, due, run_id)
VALUES (%(inbox)s, %(id)s, %(action)s, %(now)s, %(due)s, %(run)s)
ON CONFLICT (inbox_id, request_id) DO NOTHING;

-- name: approval_get
SELECT request_id, action, due, answer, requested, answered_at, answered_by
FROM approvals WHERE inbox_id = %(inbox)s AND request_id = %(id)s;

-- name: approval_answer
UPDATE approvals SET answer = %(answer)s, answered_at = %(now)s, answered_by = %(actor)s
WHERE inbox_id = %(inbox)s AND request_id = %(id)s AND answer IS NULL;

-- --- outbox ------------------------------------------------------------------------------

-- name: delivery_to_retry
SELECT id, attempts, key_salt FROM deliveries
WHERE inbox_id = %(inbox)s AND status IN ('sending', 'failed') AND NOT at_most_once
  AND (status = 'failed' OR retry_after < %(now)s)
ORDER BY id LIMIT 1;

-- name: delivery_to_retry before 4
SELECT id, attempts, NULL::bigint FROM deliveries
WHERE inbox_id = %(inbox)s AND status IN ('sending', 'failed') AND NOT at_most_once
  AND (status = 'failed' OR retry_after < %(now)s)
ORDER BY id LIMIT 1;

-- name: delivery_retry
UPDATE deliveries SET status = 'sending', attempts = attempts + 1,
       retry_after = %(retry_after)s
WHERE inbox_id = %(inbox)s AND id = %(id)s RETURNING attempts;

-- The body column is text and NOT NULL: no message here can be unsendable.
-- name: outbox_unsendable
SELECT id FROM outbox WHERE false;

-- name: outbox_set_dead
UPDATE outbox SET status = 'dead' WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- name: outbox_waiting
SELECT 1 FROM outbox
WHERE inbox_id = %(inbox)s AND status = 'held' AND delivery_id IS NULL
  AND (NOT %(urgent_only)s OR urgent)
LIMIT 1;

-- The key salt is the column's default (schema 4).
-- name: delivery_insert
INSERT INTO deliveries(inbox_id, status, attempts, paced, at_most_once, created, retry_after)
VALUES (%(inbox)s, 'sending', 1, %(paced)s, %(at_most_once)s, %(now)s, %(retry_after)s)
RETURNING id, key_salt;

-- name: delivery_insert before 4
INSERT INTO deliveries(inbox_id, status, attempts, paced, at_most_once, created, retry_after)
VALUES (%(inbox)s, 'sending', 1, %(paced)s, %(at_most_once)s, %(now)s, %(retry_after)s)
RETURNING id, NULL::bigint;

-- An urgent send carries every message held before its last urgent one (written order).
-- name: outbox_assign
UPDATE outbox SET delivery_id = %(delivery)s
WHERE inbox_id = %(inbox)s AND status = 'held' AND delivery_id IS NULL
  AND (NOT %(urgent_only)s
       OR id <= (SELECT max(id) FROM outbox
                 WHERE inbox_id = %(inbox)s AND status = 'held' AND delivery_id IS NULL
                   AND urgent));

-- name: outbox_bodies
SELECT body FROM outbox WHERE inbox_id = %(inbox)s AND delivery_id = %(delivery)s
ORDER BY id;

-- name: delivery_set_aside
UPDATE deliveries SET status = 'dead', broken = %(why)s, last_error = %(why)s
WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- name: outbox_mark
UPDATE outbox SET status = %(status)s
WHERE inbox_id = %(inbox)s AND delivery_id = %(delivery)s;

-- name: outbox_release
UPDATE outbox SET delivery_id = NULL
WHERE inbox_id = %(inbox)s AND delivery_id = %(delivery)s AND status = 'held';

-- name: delivery_row
SELECT status, attempts, at_most_once FROM deliveries
WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- name: delivery_sent
UPDATE deliveries SET status = 'sent', sent_at = %(now)s, last_error = %(error)s
WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- name: delivery_failed
UPDATE deliveries SET status = %(status)s, last_error = %(error)s
WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- name: delivery_shown
SELECT status, at_most_once, retry_after FROM deliveries
WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- name: deliveries_newest
SELECT d.id, d.status, d.attempts, d.created,
       (SELECT count(*) FROM outbox o WHERE o.inbox_id = d.inbox_id AND o.delivery_id = d.id),
       d.sent_at, d.last_error, NOT d.paced, d.at_most_once, d.retry_after, d.broken,
       d.key_salt
FROM deliveries d WHERE d.inbox_id = %(inbox)s ORDER BY d.id DESC LIMIT %(limit)s;

-- name: deliveries_newest before 4
SELECT d.id, d.status, d.attempts, d.created,
       (SELECT count(*) FROM outbox o WHERE o.inbox_id = d.inbox_id AND o.delivery_id = d.id),
       d.sent_at, d.last_error, NOT d.paced, d.at_most_once, d.retry_after, d.broken,
       NULL::bigint
FROM deliveries d WHERE d.inbox_id = %(inbox)s ORDER BY d.id DESC LIMIT %(limit)s;

-- name: deliveries_by_ids
SELECT d.id, d.status, d.attempts, d.created,
       (SELECT count(*) FROM outbox o WHERE o.inbox_id = d.inbox_id AND o.delivery_id = d.id),
       d.sent_at, d.last_error, NOT d.paced, d.at_most_once, d.retry_after, d.broken,
       d.key_salt
FROM deliveries d WHERE d.inbox_id = %(inbox)s AND d.id = ANY(%(ids)b::bigint[])
ORDER BY d.id LIMIT %(limit)s;

-- name: deliveries_by_ids before 4
SELECT d.id, d.status, d.attempts, d.created,
       (SELECT count(*) FROM outbox o WHERE o.inbox_id = d.inbox_id AND o.delivery_id = d.id),
       d.sent_at, d.last_error, NOT d.paced, d.at_most_once, d.retry_after, d.broken,
       NULL::bigint
FROM deliveries d WHERE d.inbox_id = %(inbox)s AND d.id = ANY(%(ids)b::bigint[])
ORDER BY d.id LIMIT %(limit)s;

-- name: deliveries_uncertain
SELECT id FROM deliveries
WHERE inbox_id = %(inbox)s AND status IN ('sending', 'failed') AND status = 'sending'
  AND at_most_once AND retry_after < %(now)s
ORDER BY id LIMIT %(limit)s;

-- name: delivery_next_retry
SELECT min(retry_after) + 1 FROM deliveries
WHERE inbox_id = %(inbox)s AND status = 'sending' AND NOT at_most_once;

-- --- operator actions --------------------------------------------------------------------

-- name: event_status
SELECT status, payload IS NULL FROM events WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- name: event_move
UPDATE events SET status = %(after)s, available_at = %(now)s, updated = %(now)s,
    attempts = CASE WHEN %(after)s = 'pending' THEN 0 ELSE attempts END,
    claim_gen = CASE WHEN %(after)s = 'pending' THEN NULL ELSE claim_gen END,
    error = CASE WHEN %(after)s = 'pending' THEN NULL WHEN %(after)s = 'dead' THEN %(error)s
                 ELSE error END
WHERE inbox_id = %(inbox)s AND id = %(id)s AND status = %(seen)s;

-- --- effect journal ----------------------------------------------------------------------

-- name: effect_insert
INSERT INTO effects(inbox_id, run_id, name, key, state, detail, intended_at, event_id)
VALUES (%(inbox)s, %(run)s, %(name)s, %(key)s, 'intended', %(detail)s, %(now)s, %(event)s)
ON CONFLICT (inbox_id, run_id, key) DO NOTHING;

-- name: event_key_salt
SELECT key_salt FROM events WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- name: event_key_salt before 4
SELECT NULL::bigint;

-- name: effects_intended
SELECT count(*) FROM effects
WHERE inbox_id = %(inbox)s AND run_id = %(run)s AND name = %(name)s AND event_id = %(event)s;

-- name: effect_settle
UPDATE effects SET state = %(state)s, settled_at = %(now)s
WHERE id = (SELECT max(id) FROM effects WHERE inbox_id = %(inbox)s AND key = %(key)s)
  AND state = 'intended';

-- name: effects_for_runs
SELECT id, run_id, name, key, state, detail, intended_at, settled_at FROM effects
WHERE inbox_id = %(inbox)s AND run_id = ANY(%(runs)b::bigint[]) ORDER BY id;

-- --- reads -------------------------------------------------------------------------------

-- name: event_get
SELECT id, source, source_id, payload, status, attempts, claim_gen, error, created, updated,
       available_at, claimed_at, run_id
FROM events WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- A search folds the letters A to Z only, as SQLite's lower() does (lower() here would
-- follow the database's locale, and the backends would find different events).
-- name: events_page_up
SELECT id, source, source_id, CASE WHEN %(payload)s THEN payload END, status, attempts,
       claim_gen, error, created, updated, available_at, claimed_at, run_id
FROM events
WHERE inbox_id = %(inbox)s AND status = %(status)s
  AND id > coalesce(%(after)s::bigint, -1)
  AND id < coalesce(%(before)s::bigint, 9223372036854775807)
  AND (%(search)s::text IS NULL
       OR strpos(translate(source, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz'),
                 %(search)s) > 0
       OR strpos(translate(source_id, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ',
                           'abcdefghijklmnopqrstuvwxyz'), %(search)s) > 0
       OR strpos(translate(coalesce(error, ''), 'ABCDEFGHIJKLMNOPQRSTUVWXYZ',
                           'abcdefghijklmnopqrstuvwxyz'), %(search)s) > 0)
ORDER BY id LIMIT %(limit)s;

-- name: events_page_down
SELECT id, source, source_id, CASE WHEN %(payload)s THEN payload END, status, attempts,
       claim_gen, error, created, updated, available_at, claimed_at, run_id
FROM events
WHERE inbox_id = %(inbox)s AND status = %(status)s
  AND id > coalesce(%(after)s::bigint, -1)
  AND id < coalesce(%(before)s::bigint, 9223372036854775807)
  AND (%(search)s::text IS NULL
       OR strpos(translate(source, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz'),
                 %(search)s) > 0
       OR strpos(translate(source_id, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ',
                           'abcdefghijklmnopqrstuvwxyz'), %(search)s) > 0
       OR strpos(translate(coalesce(error, ''), 'ABCDEFGHIJKLMNOPQRSTUVWXYZ',
                           'abcdefghijklmnopqrstuvwxyz'), %(search)s) > 0)
ORDER BY id DESC LIMIT %(limit)s;

-- name: event_counts
SELECT status, n FROM event_counts WHERE inbox_id = %(inbox)s;

-- name: lease_history
SELECT gen, holder, previous_holder, at, how FROM lease_history WHERE inbox_id = %(inbox)s
ORDER BY gen DESC LIMIT %(limit)s;

-- name: timers_list
SELECT id, due, every, catch_up, payload, key_source, key_id, last_fired, last_skipped,
       overflow, kind, broken
FROM timers WHERE inbox_id = %(inbox)s ORDER BY due, id LIMIT %(limit)s;

-- name: approvals_waiting
SELECT request_id, action, due, answer, requested, answered_at, answered_by
FROM approvals WHERE inbox_id = %(inbox)s AND answer IS NULL ORDER BY due LIMIT %(limit)s;

-- name: approvals_answered
SELECT request_id, action, due, answer, requested, answered_at, answered_by
FROM approvals WHERE inbox_id = %(inbox)s AND answer IS NOT NULL
ORDER BY answered_at DESC LIMIT %(limit)s;

-- name: outbox_held_list
SELECT id, body, urgent, created, status, run_id, delivery_id FROM outbox
WHERE inbox_id = %(inbox)s AND status = 'held' ORDER BY id LIMIT %(limit)s;

-- name: audit_newest
SELECT id, at, actor, action, target, before, after, applied, reason FROM audit
WHERE inbox_id = %(inbox)s ORDER BY id DESC LIMIT %(limit)s;

-- name: audit_of_target
SELECT id, at, actor, action, target, before, after, applied, reason FROM audit
WHERE inbox_id = %(inbox)s AND target = %(target)s ORDER BY id DESC LIMIT %(limit)s;

-- name: runs_by_ids
SELECT id, holder, gen, event_ids, claimed_at, finished_at, outcome, result, error, traceback
FROM runs WHERE inbox_id = %(inbox)s AND id = ANY(%(ids)b::bigint[]) ORDER BY id;

-- name: runs_of_event
SELECT id, holder, gen, event_ids, claimed_at, finished_at, outcome, result, error, traceback
FROM runs WHERE inbox_id = %(inbox)s AND id IN (SELECT run_id FROM run_events
                                                WHERE inbox_id = %(inbox)s
                                                AND event_id = %(id)s)
ORDER BY id;

-- name: overview_counts
SELECT (SELECT count(*) FROM outbox WHERE inbox_id = %(inbox)s AND status = 'held'),
       (SELECT count(*) FROM approvals WHERE inbox_id = %(inbox)s AND answer IS NULL),
       (SELECT count(*) FROM deliveries WHERE inbox_id = %(inbox)s
        AND status IN ('sending', 'failed') AND status = 'sending' AND at_most_once
        AND retry_after < %(now)s),
       (SELECT count(*) FROM timers WHERE inbox_id = %(inbox)s);

-- name: pending_next_available
SELECT min(available_at) FROM events WHERE inbox_id = %(inbox)s AND status = 'pending';

-- name: runs_counted_oldest
SELECT claimed_at FROM runs WHERE inbox_id = %(inbox)s AND claimed_at > %(since)s
ORDER BY claimed_at DESC LIMIT 1 OFFSET %(offset)s;

-- name: runs_per_minute
SELECT claimed_at / 60, count(*), count(*) FILTER (WHERE outcome IN ('error', 'lost'))
FROM runs WHERE inbox_id = %(inbox)s AND claimed_at > %(since)s GROUP BY 1 ORDER BY 1;

-- --- the run's transcript and its spend (core/engine/transcripts.py, spend.py) -------------

-- name: run_exists
SELECT 1 FROM runs WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- name: transcript_state
SELECT lines, head_end, head_chars, head_closed, tail_chars, dropped, dropped_chars,
       head_budget, tail_budget, pruned, updated, sent_dropped_chars
FROM transcripts WHERE inbox_id = %(inbox)s AND run_id = %(run)s;

-- name: transcript_state_store
INSERT INTO transcripts(inbox_id, run_id, lines, head_end, head_chars, head_closed,
                        tail_chars, dropped, dropped_chars, sent_dropped_chars, head_budget,
                        tail_budget, updated)
VALUES (%(inbox)s, %(run)s, %(lines)s, %(head_end)s, %(head_chars)s, %(head_closed)s,
        %(tail_chars)s, %(dropped)s, %(dropped_chars)s, %(sent_dropped_chars)s,
        %(head_budget)s, %(tail_budget)s, %(now)s)
ON CONFLICT (inbox_id, run_id) DO UPDATE SET lines = excluded.lines,
    head_end = excluded.head_end, head_chars = excluded.head_chars,
    head_closed = excluded.head_closed, tail_chars = excluded.tail_chars,
    dropped = excluded.dropped, dropped_chars = excluded.dropped_chars,
    sent_dropped_chars = excluded.sent_dropped_chars, updated = excluded.updated;

-- %(rows)s is a JSON list of [seq, at, level, logger, text, fields, size] (SQLite's text).
-- name: transcript_lines_insert
INSERT INTO transcript_lines(inbox_id, run_id, seq, at, level, logger, text, fields, size)
SELECT %(inbox)s, %(run)s, (r.v ->> 0)::bigint, (r.v ->> 1)::bigint, r.v ->> 2, r.v ->> 3,
       r.v ->> 4, r.v ->> 5, (r.v ->> 6)::bigint
FROM jsonb_array_elements(%(rows)s::jsonb) AS r(v)
ON CONFLICT (inbox_id, run_id, seq) DO NOTHING;

-- name: transcript_oldest_tail
SELECT seq, size FROM transcript_lines
WHERE inbox_id = %(inbox)s AND run_id = %(run)s AND seq >= %(head_end)s
ORDER BY seq LIMIT %(limit)s;

-- name: transcript_cut
DELETE FROM transcript_lines
WHERE inbox_id = %(inbox)s AND run_id = %(run)s AND seq >= %(head_end)s AND seq <= %(upto)s;

-- name: transcript_lines_after
SELECT seq, at, level, logger, text, fields FROM transcript_lines
WHERE inbox_id = %(inbox)s AND run_id = %(run)s AND seq > %(after)s ORDER BY seq
LIMIT %(limit)s;

-- name: transcript_lines_newest
SELECT seq, at, level, logger, text, fields FROM transcript_lines
WHERE inbox_id = %(inbox)s AND run_id = %(run)s ORDER BY seq DESC LIMIT %(limit)s;

-- name: transcript_last_seq
SELECT max(seq) FROM transcript_lines WHERE inbox_id = %(inbox)s AND run_id = %(run)s;

-- name: transcripts_prune_mark
UPDATE transcripts t SET pruned = true
WHERE t.inbox_id = %(inbox)s AND NOT t.pruned AND NOT EXISTS (
    SELECT 1 FROM runs r
    CROSS JOIN LATERAL jsonb_array_elements_text(r.event_ids::jsonb) AS j(id)
    JOIN events e ON e.inbox_id = r.inbox_id AND e.id = j.id::bigint
    WHERE r.inbox_id = t.inbox_id AND r.id = t.run_id AND e.payload IS NOT NULL)
RETURNING run_id;

-- name: transcript_lines_delete
DELETE FROM transcript_lines WHERE inbox_id = %(inbox)s AND run_id = ANY(%(runs)b::bigint[]);

-- name: spend_insert
INSERT INTO spend(inbox_id, run_id, seq, at, unit, micros, note)
VALUES (%(inbox)s, %(run)s, %(seq)s, %(at)s, %(unit)s, %(micros)s, %(note)s)
ON CONFLICT (inbox_id, run_id, seq) DO NOTHING;

-- numeric: a running total nothing overflows (SQLite's saturates instead).
-- name: spend_total_add
INSERT INTO spend_totals(inbox_id, unit, micros) VALUES (%(inbox)s, %(unit)s, %(micros)s)
ON CONFLICT (inbox_id, unit) DO UPDATE SET micros = spend_totals.micros + excluded.micros;

-- name: spend_since
SELECT sum(micros) FROM spend
WHERE inbox_id = %(inbox)s AND unit = %(unit)s AND at > %(since)s;

-- name: spend_reaching
SELECT max(at) FROM (
    SELECT at, sum(micros) OVER (ORDER BY at DESC, id DESC ROWS UNBOUNDED PRECEDING) AS s
    FROM spend WHERE inbox_id = %(inbox)s AND unit = %(unit)s AND at > %(since)s) AS w
WHERE s >= %(limit)s;

-- name: spend_of_runs
SELECT run_id, unit, sum(micros) FROM spend
WHERE inbox_id = %(inbox)s AND run_id = ANY(%(runs)b::bigint[])
GROUP BY run_id, unit ORDER BY run_id, unit;

-- name: spend_per_day
SELECT unit, at / 86400, sum(micros) FROM spend
WHERE inbox_id = %(inbox)s AND at >= %(since)s GROUP BY 1, 2;

-- name: spend_units_since
SELECT unit, sum(micros) FROM spend WHERE inbox_id = %(inbox)s AND at > %(since)s
GROUP BY unit ORDER BY unit;

-- name: spend_totals
SELECT unit, micros FROM spend_totals WHERE inbox_id = %(inbox)s ORDER BY unit;

-- A database before schema 3 (an older release's, read as it is: reads never migrate) has no
-- transcripts and no spend: its runs logged and spent nothing, and nothing is pruned.
-- name: transcript_state before 3
SELECT NULL WHERE false;
-- name: transcript_lines_after before 3
SELECT NULL, NULL, NULL, NULL, NULL, NULL WHERE false;
-- name: transcript_lines_newest before 3
SELECT NULL, NULL, NULL, NULL, NULL, NULL WHERE false;
-- name: transcript_last_seq before 3
SELECT NULL;
-- name: transcripts_prune_mark before 3
SELECT NULL WHERE false;
-- name: transcript_lines_delete before 3
SELECT NULL WHERE false;
-- name: spend_since before 3
SELECT NULL::bigint;
-- name: spend_reaching before 3
SELECT NULL;
-- name: spend_of_runs before 3
SELECT NULL, NULL, NULL WHERE false;
-- name: spend_per_day before 3
SELECT NULL, NULL, NULL WHERE false;
-- name: spend_units_since before 3
SELECT NULL, NULL WHERE false;
-- name: spend_totals before 3
SELECT NULL, NULL WHERE false;

-- --- what needs a person (onwatch notify) -------------------------------------------------

-- name: events_died_since
SELECT id, source, source_id, NULL, status, attempts, claim_gen, error, created, updated,
       available_at, claimed_at, run_id
FROM events WHERE inbox_id = %(inbox)s AND status = 'dead' AND updated >= %(since)s
ORDER BY updated, id LIMIT %(limit)s;

-- name: pending_oldest
SELECT created FROM events WHERE inbox_id = %(inbox)s AND status = 'pending'
ORDER BY id LIMIT 1;

-- --- the desk, round three: run now, timer actions, dead groups, workers, approval links --

-- name: event_backoff
SELECT status, available_at FROM events WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- name: event_run_now
UPDATE events SET available_at = %(now)s, updated = %(now)s
WHERE inbox_id = %(inbox)s AND id = %(id)s AND status = 'pending'
  AND available_at > %(now)s;

-- name: timer_get
SELECT id, due, every, catch_up, payload, key_source, key_id, last_fired, last_skipped,
       overflow, kind, broken, paused
FROM timers WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- name: timer_pause
UPDATE timers SET paused = %(paused)s
WHERE inbox_id = %(inbox)s AND id = %(id)s AND paused <> %(paused)s;

-- name: timers_list_paused
SELECT id, due, every, catch_up, payload, key_source, key_id, last_fired, last_skipped,
       overflow, kind, broken, paused
FROM timers WHERE inbox_id = %(inbox)s ORDER BY due, id LIMIT %(limit)s;

-- name: dead_groups
SELECT split_part(coalesce(error, ''), E'\n', 1) AS line, count(*), min(id), max(id)
FROM events WHERE inbox_id = %(inbox)s AND status = 'dead'
GROUP BY line ORDER BY count(*) DESC, line LIMIT %(limit)s;

-- name: dead_group_ids
SELECT id FROM events
WHERE inbox_id = %(inbox)s AND status = 'dead'
  AND split_part(coalesce(error, ''), E'\n', 1) = %(line)s
ORDER BY id LIMIT %(limit)s;

-- name: event_error
SELECT status, error FROM events WHERE inbox_id = %(inbox)s AND id = %(id)s;

-- A worker's heartbeat and its goodbye are one autocommit statement each (a connection's
-- `write_alone`: one round trip where a transaction takes three). Each locks the inbox's
-- row first, as a write transaction does, and counts its change itself. `now` NULL: the
-- server's clock, read once the lock is held.
-- name: worker_seen
WITH locked AS (
    SELECT id FROM inboxes WHERE id = %(inbox)s FOR UPDATE
), seen AS (
    INSERT INTO workers(inbox_id, holder, host, pid, started, seen)
    SELECT l.id, %(holder)s, %(host)s, %(pid)s, t.now, t.now
    FROM locked AS l,
         LATERAL (SELECT l.id, coalesce(%(now)s::bigint,
                                        floor(extract(epoch FROM clock_timestamp()))::bigint)
                  AS now) AS t
    ON CONFLICT (inbox_id, holder) DO UPDATE SET host = excluded.host, pid = excluded.pid,
        seen = excluded.seen,
        started = CASE WHEN workers.pid = excluded.pid AND workers.host = excluded.host
                       THEN workers.started ELSE excluded.started END
    RETURNING 1
)
UPDATE inboxes SET changes = changes + 1 WHERE id = %(inbox)s AND EXISTS (SELECT FROM seen);

-- name: worker_gone
WITH locked AS (
    SELECT id FROM inboxes WHERE id = %(inbox)s FOR UPDATE
), gone AS (
    DELETE FROM workers w USING locked AS l
    WHERE w.inbox_id = l.id AND w.holder = %(holder)s
    RETURNING 1
)
UPDATE inboxes SET changes = changes + 1 WHERE id = %(inbox)s AND EXISTS (SELECT FROM gone);

-- name: workers_list
SELECT holder, host, pid, started, seen FROM workers WHERE inbox_id = %(inbox)s
ORDER BY started, holder LIMIT %(limit)s;

-- name: lease_taken_at
SELECT at FROM lease_history WHERE inbox_id = %(inbox)s AND gen = %(gen)s;

-- name: approval_run
SELECT run_id FROM approvals WHERE inbox_id = %(inbox)s AND request_id = %(id)s;

-- name: event_by_key
SELECT id FROM events
WHERE inbox_id = %(inbox)s AND source = %(source)s AND source_id = %(source_id)s;

-- name: approvals_of_runs
SELECT request_id FROM approvals
WHERE inbox_id = %(inbox)s AND run_id = ANY(%(ids)b::bigint[])
ORDER BY requested, request_id;

-- An operator gave the inbox work without a new pending row (run now, a timer resumed):
-- its listeners are told at commit, as the events triggers tell them of new work.
-- name: inbox_notify
SELECT pg_notify('onwatch', name) FROM inboxes WHERE id = %(inbox)s;

-- The oldest transaction of another session of this database that has held old rows (a
-- snapshot, or an id of its own) for over %(seconds)s: until it ends, no row that a write
-- leaves behind can be cleaned up (vacuumed), in any table of the database. Another role's
-- sessions show here only to a role that may read their statistics (pg_read_all_stats).
-- name: held_open
SELECT pid, usename, application_name, state,
       floor(extract(epoch FROM clock_timestamp() - xact_start))::bigint
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
  AND xact_start < clock_timestamp() - make_interval(secs => %(seconds)s::double precision)
ORDER BY xact_start LIMIT 1;

-- --- databases of an older schema, read as they are (reads never migrate) ------------------

-- Before schema 5 no timer could be paused.
-- name: timer_due_any before 5
SELECT 1 FROM timers
WHERE inbox_id = %(inbox)s AND due <= %(now)s AND broken IS NULL LIMIT 1;
-- name: timers_due before 5
SELECT id, due, every, catch_up, payload, key_source, key_id, last_fired, last_skipped,
       overflow, kind, broken, NULL
FROM timers WHERE inbox_id = %(inbox)s AND due <= %(now)s AND broken IS NULL
ORDER BY due, id LIMIT %(limit)s;
-- name: timer_next_due before 5
SELECT min(due) FROM timers WHERE inbox_id = %(inbox)s AND broken IS NULL;
-- name: timer_get before 5
SELECT id, due, every, catch_up, payload, key_source, key_id, last_fired, last_skipped,
       overflow, kind, broken, false
FROM timers WHERE inbox_id = %(inbox)s AND id = %(id)s;
-- name: timers_list_paused before 5
SELECT id, due, every, catch_up, payload, key_source, key_id, last_fired, last_skipped,
       overflow, kind, broken, false
FROM timers WHERE inbox_id = %(inbox)s ORDER BY due, id LIMIT %(limit)s;

-- Before schema 6 no worker was recorded but the lease holder (in the inbox's row).
-- name: workers_list before 6
SELECT NULL, NULL, NULL, NULL, NULL WHERE false;
-- name: worker_seen before 6
SELECT NULL WHERE false;
-- name: worker_gone before 6
SELECT NULL WHERE false;
