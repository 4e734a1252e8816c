-- The named statements of an inbox file (core/engine/queries.py reads them).
--
-- One file is one inbox: no statement names an inbox. Parameters are named (:name); a list
-- parameter arrives as JSON text and is read with json_each. The engine's scripts
-- (core/engine/*.py) run these by name; core/pg/queries.sql has the same names.
-- `-- name: NAME before N` keeps a statement's former text for a file of a schema older
-- than N, opened without migrating (core/engine/queries.py).
-- INDEXED BY pins the partial indexes the planner would otherwise not pick for a bound
-- parameter (a million events must cost what ten do).

-- --- settings and switches ---------------------------------------------------------------

-- name: settings_load
SELECT json FROM settings WHERE id = 1;

-- name: settings_store
INSERT INTO settings(id, json) VALUES (1, :json)
ON CONFLICT(id) DO UPDATE SET json = excluded.json;

-- The lease, the settings and the pause switch in one read (one row, lease or not).
-- name: inbox_state
SELECT (SELECT holder FROM lease WHERE id = 1), (SELECT gen FROM lease WHERE id = 1),
       (SELECT until FROM lease WHERE id = 1), (SELECT json FROM settings WHERE id = 1),
       (SELECT value FROM meta WHERE key = 'paused');

-- name: meta_get
SELECT value FROM meta WHERE key = :key;

-- name: meta_set
INSERT INTO meta(key, value) VALUES (:key, :value)
ON CONFLICT(key) DO UPDATE SET value = excluded.value;

-- name: meta_bump
INSERT INTO meta(key, value) VALUES (:key, 1)
ON CONFLICT(key) DO UPDATE SET value = coalesce(value, 0) + 1;

-- name: audit_insert
INSERT INTO audit(at, actor, action, target, before, after, applied, reason)
VALUES (:at, :actor, :action, :target, :before, :after, :applied, :reason);

-- --- intake ------------------------------------------------------------------------------

-- A lone new event in one autocommit statement, stored only while the settings are still
-- the ones the caller checked against (core/engine/intake.py `ingest_alone`).
-- name: event_insert_alone
INSERT INTO events(source, source_id, payload, available_at, created, updated, key_salt)
SELECT :source, :source_id, :payload, :now, :now, :now, random()
WHERE (SELECT json FROM settings WHERE id = 1) IS :settings
ON CONFLICT(source, source_id) DO NOTHING;

-- name: event_insert_alone before 8
INSERT INTO events(source, source_id, payload, available_at, created, updated)
SELECT :source, :source_id, :payload, :now, :now, :now
WHERE (SELECT json FROM settings WHERE id = 1) IS :settings
ON CONFLICT(source, source_id) DO NOTHING;

-- Many new events in one statement, inserted in order (a key repeated among them is a
-- duplicate of its first copy). {rows} stands for one events_insert_row per event, bound
-- positionally (source, source_id, payload, now, now, now): a value the file cannot hold
-- (an integer past 64 bits) is refused by the driver, never stored as something else.
-- Each new event draws its key salt (docs/rules.md#effects-and-their-keys).
-- name: events_insert
INSERT INTO events(source, source_id, payload, available_at, created, updated, key_salt)
VALUES {rows}
ON CONFLICT(source, source_id) DO NOTHING
RETURNING source, source_id;

-- name: events_insert before 8
INSERT INTO events(source, source_id, payload, available_at, created, updated) VALUES {rows}
ON CONFLICT(source, source_id) DO NOTHING
RETURNING source, source_id;

-- name: events_insert_row
(?,?,?,?,?,?,random())

-- name: events_insert_row before 8
(?,?,?,?,?,?)

-- name: pending_count
SELECT n FROM event_counts WHERE status = 'pending';

-- name: event_key
SELECT 1 FROM events WHERE source = :source AND source_id = :source_id;

-- name: events_prune
UPDATE events SET payload = NULL, updated = :now
WHERE status IN ('done', 'cancelled') AND updated < :older_than AND payload IS NOT NULL;

-- --- lease -------------------------------------------------------------------------------

-- name: lease_first
INSERT INTO lease(id, holder, gen, until) VALUES (1, :holder, 1, :until);

-- name: lease_extend
UPDATE lease SET until = :until WHERE id = 1;

-- name: lease_take
UPDATE lease SET holder = :holder, gen = :gen, until = :until WHERE id = 1;

-- name: lease_history_insert
INSERT INTO lease_history(gen, holder, previous_holder, at, how)
VALUES (:gen, :holder, :previous, :at, :how);

-- name: lease_history_last_gen
SELECT coalesce(max(gen), 0) FROM lease_history;

-- --- claiming ----------------------------------------------------------------------------

-- name: lost_claims
SELECT id, source, claim_gen, run_id FROM events INDEXED BY events_by_status
WHERE status = 'running' AND claim_gen < :gen;

-- name: overdue_claims
SELECT id, source, claim_gen, run_id FROM events INDEXED BY events_by_status
WHERE status = 'running' AND claim_gen = :gen AND claimed_at < :before;

-- name: event_interrupt
UPDATE events SET status = 'interrupted', error = :error, updated = :now WHERE id = :id;

-- Not backed off: the lease expiry already delayed it.
-- name: event_requeue_lost
UPDATE events SET status = 'pending', available_at = :now, error = :error, updated = :now
WHERE id = :id;

-- name: run_lost
UPDATE runs SET outcome = 'lost', finished_at = :now, error = :error
WHERE id = :id AND outcome IS NULL;

-- Only the rows whose attempts reached the limit are looked at (a range of their partial
-- index), never every event waiting out a backoff. Of two lower bounds on attempts SQLite
-- takes the first one written as the range's start: the limit comes first (`attempts > 0`
-- is there for the partial index only).
-- name: bury_exhausted
UPDATE events INDEXED BY events_retry_spent
SET status = 'dead', updated = :now,
    error = 'too many attempts (' || attempts || '/' || :max_attempts || ')'
            || coalesce(': ' || error, '')
WHERE attempts >= :max_attempts AND status = 'pending' AND attempts > 0
  AND typeof(attempts) = 'integer';

-- name: bury_exhausted before 8
UPDATE events INDEXED BY events_retried
SET status = 'dead', updated = :now,
    error = 'too many attempts (' || attempts || '/' || :max_attempts || ')'
            || coalesce(': ' || error, '')
WHERE status = 'pending' AND typeof(attempts) = 'integer' AND attempts > 0
  AND attempts >= :max_attempts;

-- name: runs_since
SELECT count(*) FROM runs WHERE claimed_at > :since;

-- What the next run may take, in one statement: the oldest retried event whose backoff is
-- over (a range of the index by availability, so the events still waiting out theirs are
-- never read), tagged 1; and the oldest never-attempted events that may run now (their own
-- index, in id order), tagged 0. A retried one, if any, runs alone (core/engine/runs.py).
-- name: claimable_next
SELECT * FROM (
    SELECT id, source, source_id, payload, status, attempts, claim_gen, error, created, updated,
       available_at, claimed_at, run_id, 1
    FROM events INDEXED BY events_retry_due
    WHERE status = 'pending' AND attempts > 0 AND available_at <= :now
    ORDER BY id LIMIT 1)
UNION ALL
SELECT * FROM (
    SELECT id, source, source_id, payload, status, attempts, claim_gen, error, created, updated,
       available_at, claimed_at, run_id, 0
    FROM events INDEXED BY events_fresh
    WHERE status = 'pending' AND attempts = 0 AND available_at <= :now
    ORDER BY id LIMIT :limit);

-- name: claimable_next before 8
SELECT * FROM (
    SELECT id, source, source_id, payload, status, attempts, claim_gen, error, created, updated,
       available_at, claimed_at, run_id, 1
    FROM events INDEXED BY events_retried
    WHERE status = 'pending' AND attempts > 0 AND available_at <= :now
    ORDER BY id LIMIT 1)
UNION ALL
SELECT * FROM (
    SELECT id, source, source_id, payload, status, attempts, claim_gen, error, created, updated,
       available_at, claimed_at, run_id, 0
    FROM events INDEXED BY events_by_status
    WHERE status = 'pending' AND attempts = 0 AND available_at <= :now
    ORDER BY id LIMIT :limit);

-- name: event_set_aside
UPDATE events SET status = 'dead', error = :error, updated = :now WHERE id = :id;

-- Its id is the connection's last inserted rowid (RETURNING would build a temporary table).
-- name: run_insert
INSERT INTO runs(holder, gen, event_ids, claimed_at) VALUES (:holder, :gen, :ids, :now);

-- name: run_events_link
INSERT INTO run_events(event_id, run_id) SELECT value, :run FROM json_each(:ids);

-- The same for a run of one event (a worker's `max_batch=1`): no JSON to read.
-- name: run_event_link
INSERT INTO run_events(event_id, run_id) VALUES (:id, :run);

-- Attempts are counted here, at claim time: a worker that crashes never reports failure.
-- An event stored without a key salt (by a release before schema 8) draws one at its
-- first claim; one that already ran keeps none, and the keys it had.
-- name: events_claim
UPDATE events SET status = 'running', attempts = attempts + 1, claim_gen = :gen,
       claimed_at = :now, run_id = :run, updated = :now,
       key_salt = coalesce(key_salt, CASE WHEN run_id IS NULL THEN random() END)
WHERE id IN (SELECT value FROM json_each(:ids));

-- name: events_claim before 8
UPDATE events SET status = 'running', attempts = attempts + 1, claim_gen = :gen,
       claimed_at = :now, run_id = :run, updated = :now
WHERE id IN (SELECT value FROM json_each(:ids));

-- --- finishing ---------------------------------------------------------------------------

-- name: run_open
SELECT event_ids FROM runs WHERE id = :id AND gen = :gen AND outcome IS NULL;

-- name: run_outcome
SELECT gen, outcome FROM runs WHERE id = :id;

-- name: events_finish_done
UPDATE events SET status = 'done', error = NULL, updated = :now
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'running' AND claim_gen = :gen
  AND (:run IS NULL OR run_id = :run)
RETURNING id, attempts, run_id;

-- name: events_still_claimed
SELECT id, attempts, run_id FROM events
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'running' AND claim_gen = :gen
  AND (:run IS NULL OR run_id = :run)
ORDER BY id;

-- name: outbox_insert
INSERT INTO outbox(body, urgent, created, run_id) VALUES (:body, :urgent, :now, :run);

-- name: event_bury
UPDATE events SET status = 'dead', error = :error, updated = :now WHERE id = :id;

-- name: event_retry_later
UPDATE events SET status = 'pending', error = :error, available_at = :available_at,
       updated = :now
WHERE id = :id;

-- A run closes when its last event is finished (a run may be finished in parts).
-- name: runs_close
UPDATE runs SET outcome = :outcome, finished_at = :now, result = :result, error = :error,
       traceback = :traceback
WHERE id IN (SELECT value FROM json_each(:runs)) AND outcome IS NULL
  AND NOT EXISTS (SELECT 1 FROM events WHERE run_id = runs.id AND status = 'running');

-- --- timers ------------------------------------------------------------------------------

-- name: timer_upsert
INSERT INTO timers(id, kind, due, every, catch_up, payload, key_source, key_id)
VALUES (:id, :kind, :due, :every, :catch_up, :payload, :key_source, :key_id)
ON CONFLICT(id) DO UPDATE SET kind = excluded.kind, due = excluded.due,
    every = excluded.every, catch_up = excluded.catch_up, payload = excluded.payload,
    key_source = excluded.key_source, key_id = excluded.key_id, broken = NULL;

-- name: timers_delete
DELETE FROM timers WHERE id IN (SELECT value FROM json_each(:ids));

-- A timer an operator paused is not due until resumed.
-- name: timer_due_any
SELECT 1 FROM timers WHERE due <= :now AND broken IS NULL AND paused = 0 LIMIT 1;

-- The last column says the payload is JSON (strict RFC 8259), so that a one-shot timer
-- fires without decoding it (core/engine/timing.py `plain_occurrence`).
-- name: timers_due
SELECT id, due, every, catch_up, payload, key_source, key_id, last_fired, last_skipped,
       overflow, kind, broken, json_valid(payload)
FROM timers WHERE due <= :now AND broken IS NULL AND paused = 0
ORDER BY due, id LIMIT :limit;

-- Plain timers, fired by set statements (SqliteTx.fire_plain_timers): the next :limit due
-- timers in due order, each with whether it is plain. Plain is what core/engine/timing.py
-- `plain_occurrence` and `plain_recurring` would fire as one event whose payload splices the
-- stored JSON text (proven by json_valid, with few enough brackets for Python's decoder):
-- a valid one-shot timer, or a valid recurring one due once or coalescing what it missed.
-- Anything else (an approval's expiry, `each` with several occurrences due, a value no valid
-- call stores) is planned row by row.
-- name: timers_due_plain
SELECT due, id,
       kind = 'timer' AND typeof(id) = 'text'
       AND typeof(due) = 'integer' AND due BETWEEN 0 AND 9007199254740992
       AND catch_up IN ('coalesce', 'each')
       AND typeof(overflow) = 'integer' AND overflow BETWEEN 0 AND 4611686018427387904
       AND (last_fired IS NULL
            OR typeof(last_fired) = 'integer' AND last_fired BETWEEN 0 AND 9007199254740992)
       AND (payload IS NULL
            OR typeof(payload) = 'text' AND json_valid(payload)
               AND CASE WHEN length(payload) <= 100 THEN 1  -- too short for 101 brackets
                   ELSE length(payload) - length(replace(replace(payload, '[', ''), '{', ''))
                        <= 100 END)
       AND CASE WHEN every IS NULL
           THEN key_source IS NULL
                OR typeof(key_source) = 'text' AND typeof(key_id) = 'text'
                   AND length(key_source) > 0 AND length(key_id) > 0
           ELSE typeof(every) = 'integer' AND every BETWEEN 1 AND 9007199254740992
                AND key_source IS NULL
                AND (last_fired IS NULL OR due > last_fired)
                AND (catch_up = 'coalesce' OR :now - due < every) END
FROM timers WHERE due <= :now AND broken IS NULL AND paused = 0
ORDER BY due, id LIMIT :limit;

-- The due timers up to (:due, :id) in due order (:due is at most :now; the row value bounds
-- the index range on both columns, so a chunk of a storm due at one instant reads only its
-- own rows), all plain (timers_due_plain said so in this transaction): each fires its one
-- event, as timing.py's plain planners write it. A recurring timer's occurrence is its
-- latest one due (`at`); how many it missed before that are counted as skipped.
-- name: timers_fire_plain
INSERT INTO events(source, source_id, payload, available_at, created, updated, key_salt)
SELECT CASE WHEN key_source IS NULL THEN 'timer' ELSE key_source END,
       CASE WHEN key_source IS NULL THEN id || '@' || at ELSE key_id END,
       '{"timer": ' || json_quote(id) || ', "scheduled_for": ' || at || ', "late_by": '
           || (:now - at) || ', "skipped": ' || missed || ', "data": '
           || coalesce(payload, 'null') || '}',
       :now, :now, :now, random()
FROM (SELECT id, key_source, key_id, payload, due, due + missed * coalesce(every, 0) AS at,
             missed
      FROM (SELECT id, key_source, key_id, payload, due, every,
                   coalesce((:now - due) / every, 0) AS missed
            FROM timers WHERE (due, id) <= (:due, :id) AND broken IS NULL AND paused = 0))
WHERE true ORDER BY due, id
ON CONFLICT(source, source_id) DO NOTHING;

-- The same recurring timers moved on past :now; the one-shot ones deleted.
-- name: timers_advance_plain
UPDATE timers SET due = due + ((:now - due) / every + 1) * every,
       last_fired = due + (:now - due) / every * every,
       last_skipped = (:now - due) / every
WHERE (due, id) <= (:due, :id) AND broken IS NULL AND paused = 0
  AND every IS NOT NULL;

-- name: timers_delete_plain
DELETE FROM timers
WHERE (due, id) <= (:due, :id) AND broken IS NULL AND paused = 0 AND every IS NULL;

-- Recurring timers moved on: :rows is a JSON list of [id, due, last_fired, last_skipped,
-- overflow]; a null keeps the stored value, overflow is added.
-- name: timers_advance
UPDATE timers SET due = json_extract(u.value, '$[1]'),
       last_fired = coalesce(json_extract(u.value, '$[2]'), last_fired),
       last_skipped = coalesce(json_extract(u.value, '$[3]'), last_skipped),
       overflow = overflow + json_extract(u.value, '$[4]')
FROM json_each(:rows) AS u WHERE timers.id = json_extract(u.value, '$[0]');

-- name: timer_set_aside
UPDATE timers SET broken = :why WHERE id = :id;

-- A due written by hand as text never fires (text sorts after every number): not counted.
-- name: timer_next_due
SELECT min(due) FROM timers WHERE broken IS NULL AND paused = 0 AND typeof(due) = 'integer';

-- --- approvals ---------------------------------------------------------------------------

-- name: approval_insert
INSERT INTO approvals(request_id, action, requested, due, run_id)
VALUES (:id, :action, :now, :due, :run)
ON CONFLICT(request_id) DO NOTHING;

-- name: approval_get
SELECT request_id, action, due, answer, requested, answered_at, answered_by
FROM approvals WHERE request_id = :id;

-- name: approval_answer
UPDATE approvals SET answer = :answer, answered_at = :now, answered_by = :actor
WHERE request_id = :id AND answer IS NULL;

-- --- outbox ------------------------------------------------------------------------------

-- The next delivery to send again: a failed one, or one a crashed dispatcher left
-- 'sending' past its timeout (at least once only).
-- name: delivery_to_retry
SELECT id, attempts, key_salt FROM deliveries
WHERE status IN ('sending', 'failed') AND at_most_once = 0
  AND (status = 'failed' OR retry_after < :now)
ORDER BY id LIMIT 1;

-- name: delivery_to_retry before 8
SELECT id, attempts, NULL FROM deliveries
WHERE status IN ('sending', 'failed') AND at_most_once = 0
  AND (status = 'failed' OR retry_after < :now)
ORDER BY id LIMIT 1;

-- name: delivery_retry
UPDATE deliveries SET status = 'sending', attempts = attempts + 1, retry_after = :retry_after
WHERE id = :id RETURNING attempts;

-- A message row no valid call could have written: its body is not text.
-- name: outbox_unsendable
SELECT id FROM outbox
WHERE status = 'held' AND delivery_id IS NULL AND typeof(body) <> 'text';

-- name: outbox_set_dead
UPDATE outbox SET status = 'dead' WHERE id = :id;

-- name: outbox_waiting
SELECT 1 FROM outbox
WHERE status = 'held' AND delivery_id IS NULL AND (NOT :urgent_only OR urgent = 1)
LIMIT 1;

-- name: delivery_insert
INSERT INTO deliveries(status, attempts, paced, at_most_once, created, retry_after, key_salt)
VALUES ('sending', 1, :paced, :at_most_once, :now, :retry_after, random())
RETURNING id, key_salt;

-- name: delivery_insert before 8
INSERT INTO deliveries(status, attempts, paced, at_most_once, created, retry_after)
VALUES ('sending', 1, :paced, :at_most_once, :now, :retry_after)
RETURNING id, NULL;

-- Messages leave in the order they were written: an urgent send carries every message held
-- before its last urgent one, so a reply never overtakes what was written ahead of it.
-- name: outbox_assign
UPDATE outbox SET delivery_id = :delivery
WHERE status = 'held' AND delivery_id IS NULL
  AND (NOT :urgent_only OR id <= (SELECT max(id) FROM outbox
                                  WHERE status = 'held' AND delivery_id IS NULL AND urgent = 1));

-- name: outbox_bodies
SELECT body FROM outbox WHERE delivery_id = :delivery ORDER BY id;

-- name: delivery_set_aside
UPDATE deliveries SET status = 'dead', broken = :why, last_error = :why WHERE id = :id;

-- name: outbox_mark
UPDATE outbox SET status = :status WHERE delivery_id = :delivery;

-- name: outbox_release
UPDATE outbox SET delivery_id = NULL WHERE delivery_id = :delivery AND status = 'held';

-- name: delivery_row
SELECT status, attempts, at_most_once FROM deliveries WHERE id = :id;

-- name: delivery_sent
UPDATE deliveries SET status = 'sent', sent_at = :now, last_error = :error WHERE id = :id;

-- name: delivery_failed
UPDATE deliveries SET status = :status, last_error = :error WHERE id = :id;

-- name: delivery_shown
SELECT status, at_most_once, retry_after FROM deliveries WHERE id = :id;

-- name: deliveries_newest
SELECT d.id, d.status, d.attempts, d.created,
       (SELECT count(*) FROM outbox o WHERE o.delivery_id = d.id), d.sent_at, d.last_error,
       NOT d.paced, d.at_most_once, d.retry_after, d.broken, d.key_salt
FROM deliveries d ORDER BY d.id DESC LIMIT :limit;

-- name: deliveries_newest before 8
SELECT d.id, d.status, d.attempts, d.created,
       (SELECT count(*) FROM outbox o WHERE o.delivery_id = d.id), d.sent_at, d.last_error,
       NOT d.paced, d.at_most_once, d.retry_after, d.broken, NULL
FROM deliveries d ORDER BY d.id DESC LIMIT :limit;

-- name: deliveries_by_ids
SELECT d.id, d.status, d.attempts, d.created,
       (SELECT count(*) FROM outbox o WHERE o.delivery_id = d.id), d.sent_at, d.last_error,
       NOT d.paced, d.at_most_once, d.retry_after, d.broken, d.key_salt
FROM deliveries d WHERE d.id IN (SELECT value FROM json_each(:ids))
ORDER BY d.id LIMIT :limit;

-- name: deliveries_by_ids before 8
SELECT d.id, d.status, d.attempts, d.created,
       (SELECT count(*) FROM outbox o WHERE o.delivery_id = d.id), d.sent_at, d.last_error,
       NOT d.paced, d.at_most_once, d.retry_after, d.broken, NULL
FROM deliveries d WHERE d.id IN (SELECT value FROM json_each(:ids))
ORDER BY d.id LIMIT :limit;

-- An at-most-once delivery still 'sending' after its send_timeout was cut off mid-send.
-- (The IN term lets SQLite use the partial index of open deliveries, never a scan.)
-- name: deliveries_uncertain
SELECT id FROM deliveries
WHERE status IN ('sending', 'failed') AND status = 'sending' AND at_most_once = 1
  AND retry_after < :now
ORDER BY id LIMIT :limit;

-- name: delivery_next_retry
SELECT min(retry_after) + 1 FROM deliveries WHERE status = 'sending' AND at_most_once = 0;

-- --- operator actions --------------------------------------------------------------------

-- name: event_status
SELECT status, payload IS NULL FROM events WHERE id = :id;

-- Back to pending: a fresh attempt budget; to dead: who sent it there and why.
-- name: event_move
UPDATE events SET status = :after, available_at = :now, updated = :now,
    attempts = CASE WHEN :after = 'pending' THEN 0 ELSE attempts END,
    claim_gen = CASE WHEN :after = 'pending' THEN NULL ELSE claim_gen END,
    error = CASE WHEN :after = 'pending' THEN NULL WHEN :after = 'dead' THEN :error
                 ELSE error END
WHERE id = :id AND status = :seen;

-- --- effect journal ----------------------------------------------------------------------

-- name: effect_insert
INSERT INTO effects(run_id, name, key, state, detail, intended_at, event_id)
VALUES (:run, :name, :key, 'intended', :detail, :now, :event)
ON CONFLICT(run_id, key) DO NOTHING;

-- The salt an event's effect keys carry (NULL: stored before schema 8, keys without one).
-- name: event_key_salt
SELECT key_salt FROM events WHERE id = :id;

-- name: event_key_salt before 8
SELECT NULL;

-- name: effects_intended
SELECT count(*) FROM effects WHERE run_id = :run AND name = :name AND event_id = :event;

-- The newest intent under this key is the one being settled.
-- name: effect_settle
UPDATE effects SET state = :state, settled_at = :now
WHERE id = (SELECT max(id) FROM effects WHERE key = :key) AND state = 'intended';

-- name: effects_for_runs
SELECT id, run_id, name, key, state, detail, intended_at, settled_at FROM effects
WHERE run_id IN (SELECT value FROM json_each(:runs)) ORDER BY id;

-- --- reads -------------------------------------------------------------------------------

-- name: event_get
SELECT id, source, source_id, payload, status, attempts, claim_gen, error, created, updated,
       available_at, claimed_at, run_id
FROM events WHERE id = :id;

-- A keyset page by id (ascending after :after, or descending before :before), payloads
-- only when asked for; the id bounds are ranges on the index whether given or not. A
-- search folds the letters A to Z only (SQLite's lower(); core/engine/reads.py `folded`).
-- name: events_page_up
SELECT id, source, source_id, CASE WHEN :payload THEN payload END, status, attempts,
       claim_gen, error, created, updated, available_at, claimed_at, run_id
FROM events INDEXED BY events_by_status
WHERE status = :status AND id > coalesce(:after, -1)
  AND id < coalesce(:before, 9223372036854775807)
  AND (:search IS NULL OR instr(lower(source), :search) > 0
       OR instr(lower(source_id), :search) > 0
       OR instr(lower(coalesce(error, '')), :search) > 0)
ORDER BY id LIMIT :limit;

-- name: events_page_down
SELECT id, source, source_id, CASE WHEN :payload THEN payload END, status, attempts,
       claim_gen, error, created, updated, available_at, claimed_at, run_id
FROM events INDEXED BY events_by_status
WHERE status = :status AND id > coalesce(:after, -1)
  AND id < coalesce(:before, 9223372036854775807)
  AND (:search IS NULL OR instr(lower(source), :search) > 0
       OR instr(lower(source_id), :search) > 0
       OR instr(lower(coalesce(error, '')), :search) > 0)
ORDER BY id DESC LIMIT :limit;

-- name: event_counts
SELECT status, n FROM event_counts;

-- name: lease_history
SELECT gen, holder, previous_holder, at, how FROM lease_history ORDER BY gen DESC
LIMIT :limit;

-- name: timers_list
SELECT id, due, every, catch_up, payload, key_source, key_id, last_fired, last_skipped,
       overflow, kind, broken
FROM timers ORDER BY due, id LIMIT :limit;

-- name: approvals_waiting
SELECT request_id, action, due, answer, requested, answered_at, answered_by
FROM approvals WHERE answer IS NULL ORDER BY due LIMIT :limit;

-- name: approvals_answered
SELECT request_id, action, due, answer, requested, answered_at, answered_by
FROM approvals WHERE answer IS NOT NULL ORDER BY answered_at DESC LIMIT :limit;

-- name: outbox_held_list
SELECT id, body, urgent, created, status, run_id, delivery_id FROM outbox
WHERE status = 'held' ORDER BY id LIMIT :limit;

-- name: audit_newest
SELECT id, at, actor, action, target, before, after, applied, reason FROM audit
ORDER BY id DESC LIMIT :limit;

-- name: audit_of_target
SELECT id, at, actor, action, target, before, after, applied, reason FROM audit
WHERE target = :target ORDER BY id DESC LIMIT :limit;

-- name: runs_by_ids
SELECT id, holder, gen, event_ids, claimed_at, finished_at, outcome, result, error, traceback
FROM runs WHERE id IN (SELECT value FROM json_each(:ids)) ORDER BY id;

-- name: runs_of_event
SELECT id, holder, gen, event_ids, claimed_at, finished_at, outcome, result, error, traceback
FROM runs WHERE id IN (SELECT run_id FROM run_events WHERE event_id = :id) ORDER BY id;

-- (The IN term lets SQLite use the partial index of open deliveries, never a scan.)
-- name: overview_counts
SELECT (SELECT count(*) FROM outbox WHERE status = 'held'),
       (SELECT count(*) FROM approvals WHERE answer IS NULL),
       (SELECT count(*) FROM deliveries WHERE status IN ('sending', 'failed')
        AND status = 'sending' AND at_most_once = 1 AND retry_after < :now),
       (SELECT count(*) FROM timers);

-- name: pending_next_available
SELECT min(available_at) FROM events INDEXED BY events_pending_available
WHERE status = 'pending';

-- The claim instant of the oldest run still counted in the day's window, once the
-- runs-per-day budget is used up (none while a slot is free).
-- name: runs_counted_oldest
SELECT claimed_at FROM runs WHERE claimed_at > :since ORDER BY claimed_at DESC
LIMIT 1 OFFSET :offset;

-- name: runs_per_minute
SELECT claimed_at / 60, count(*), sum(outcome IN ('error', 'lost')) FROM runs
WHERE claimed_at > :since GROUP BY 1 ORDER BY 1;

-- --- the run's transcript and its spend (core/engine/transcripts.py, spend.py) -------------

-- name: run_exists
SELECT 1 FROM runs WHERE id = :id;

-- name: transcript_state
SELECT lines, head_end, head_chars, head_closed, tail_chars, dropped, dropped_chars,
       head_budget, tail_budget, pruned, updated, sent_dropped_chars
FROM transcripts WHERE run_id = :run;

-- name: transcript_state_store
INSERT INTO transcripts(run_id, lines, head_end, head_chars, head_closed, tail_chars, dropped,
                        dropped_chars, sent_dropped_chars, head_budget, tail_budget, updated)
VALUES (:run, :lines, :head_end, :head_chars, :head_closed, :tail_chars, :dropped,
        :dropped_chars, :sent_dropped_chars, :head_budget, :tail_budget, :now)
ON CONFLICT(run_id) DO UPDATE SET lines = excluded.lines, head_end = excluded.head_end,
    head_chars = excluded.head_chars, head_closed = excluded.head_closed,
    tail_chars = excluded.tail_chars, dropped = excluded.dropped,
    dropped_chars = excluded.dropped_chars, sent_dropped_chars = excluded.sent_dropped_chars,
    updated = excluded.updated;

-- :rows is a JSON list of [seq, at, level, logger, text, fields, size]: one statement for
-- a whole batch (the same text parameter as PostgreSQL's, which reads it as jsonb).
-- name: transcript_lines_insert
INSERT INTO transcript_lines(run_id, seq, at, level, logger, text, fields, size)
SELECT :run, json_extract(value, '$[0]'), json_extract(value, '$[1]'),
       json_extract(value, '$[2]'), json_extract(value, '$[3]'), json_extract(value, '$[4]'),
       json_extract(value, '$[5]'), json_extract(value, '$[6]')
FROM json_each(:rows)
WHERE true
ON CONFLICT(run_id, seq) DO NOTHING;

-- The oldest lines of the transcript's end (after its beginning), to be dropped first.
-- name: transcript_oldest_tail
SELECT seq, size FROM transcript_lines
WHERE run_id = :run AND seq >= :head_end ORDER BY seq LIMIT :limit;

-- name: transcript_cut
DELETE FROM transcript_lines WHERE run_id = :run AND seq >= :head_end AND seq <= :upto;

-- name: transcript_lines_after
SELECT seq, at, level, logger, text, fields FROM transcript_lines
WHERE run_id = :run AND seq > :after ORDER BY seq LIMIT :limit;

-- name: transcript_lines_newest
SELECT seq, at, level, logger, text, fields FROM transcript_lines
WHERE run_id = :run ORDER BY seq DESC LIMIT :limit;

-- name: transcript_last_seq
SELECT max(seq) FROM transcript_lines WHERE run_id = :run;

-- A run's lines go with the payloads of its events: once none of them keeps one.
-- name: transcripts_prune_mark
UPDATE transcripts SET pruned = 1
WHERE pruned = 0 AND NOT EXISTS (
    SELECT 1 FROM runs r, json_each(r.event_ids) j JOIN events e ON e.id = j.value
    WHERE r.id = transcripts.run_id AND e.payload IS NOT NULL)
RETURNING run_id;

-- name: transcript_lines_delete
DELETE FROM transcript_lines WHERE run_id IN (SELECT value FROM json_each(:runs));

-- name: spend_insert
INSERT INTO spend(run_id, seq, at, unit, micros, note)
VALUES (:run, :seq, :at, :unit, :micros, :note)
ON CONFLICT(run_id, seq) DO NOTHING;

-- Saturating: a running total a hand-made flood of spends cannot overflow.
-- name: spend_total_add
INSERT INTO spend_totals(unit, micros) VALUES (:unit, :micros)
ON CONFLICT(unit) DO UPDATE SET micros = min(micros + excluded.micros, 9000000000000000000);

-- total() is a float, exact below 2^53 millionths, and never overflows as sum() can.
-- name: spend_since
SELECT total(micros) FROM spend WHERE unit = :unit AND at > :since;

-- The newest spend that, with every newer one, reaches :limit (the budget frees once it
-- leaves the window).
-- name: spend_reaching
SELECT max(at) FROM (
    SELECT at, total(micros) OVER (ORDER BY at DESC, id DESC ROWS UNBOUNDED PRECEDING) AS s
    FROM spend WHERE unit = :unit AND at > :since)
WHERE s >= :limit;

-- name: spend_of_runs
SELECT run_id, unit, total(micros) FROM spend
WHERE run_id IN (SELECT value FROM json_each(:runs)) GROUP BY run_id, unit ORDER BY run_id, unit;

-- Per unit (spend_totals: one row per unit ever spent) and per UTC day from :since to :until,
-- each a range of the (unit, at, micros) index: no sort of the window's rows, however many.
-- name: spend_per_day
WITH RECURSIVE days(day) AS (
    SELECT :since / 86400 UNION ALL SELECT day + 1 FROM days WHERE day < :until / 86400)
SELECT unit, day, used FROM (
    SELECT spend_totals.unit AS unit, days.day AS day,
           (SELECT total(micros) FROM spend
            WHERE spend.unit = spend_totals.unit
              AND spend.at >= days.day * 86400 AND spend.at < (days.day + 1) * 86400) AS used
    FROM spend_totals, days)
WHERE used > 0;

-- name: spend_units_since
SELECT unit, used FROM (
    SELECT unit,
           (SELECT total(micros) FROM spend
            WHERE spend.unit = spend_totals.unit AND spend.at > :since) AS used
    FROM spend_totals)
WHERE used > 0 ORDER BY unit;

-- name: spend_totals
SELECT unit, micros FROM spend_totals ORDER BY unit;

-- A file before schema 7 (an older release's, read as it is: reads never migrate) has no
-- transcripts and no spend: its runs logged and spent nothing, and nothing is pruned.
-- name: transcript_state before 7
SELECT NULL WHERE 0;
-- name: transcript_lines_after before 7
SELECT NULL, NULL, NULL, NULL, NULL, NULL WHERE 0;
-- name: transcript_lines_newest before 7
SELECT NULL, NULL, NULL, NULL, NULL, NULL WHERE 0;
-- name: transcript_last_seq before 7
SELECT NULL;
-- name: transcripts_prune_mark before 7
SELECT NULL WHERE 0;
-- name: transcript_lines_delete before 7
SELECT NULL WHERE 0;
-- name: spend_since before 7
SELECT 0.0;
-- name: spend_reaching before 7
SELECT NULL;
-- name: spend_of_runs before 7
SELECT NULL, NULL, NULL WHERE 0;
-- name: spend_per_day before 7
SELECT NULL, NULL, NULL WHERE 0;
-- name: spend_units_since before 7
SELECT NULL, NULL WHERE 0;
-- name: spend_totals before 7
SELECT NULL, NULL WHERE 0;

-- --- what needs a person (onwatch notify) -------------------------------------------------

-- Events that died at or after :since, oldest first (a partial index: only dead rows).
-- name: events_died_since
SELECT id, source, source_id, NULL, status, attempts, claim_gen, error, created, updated,
       available_at, claimed_at, run_id
FROM events INDEXED BY events_died
WHERE status = 'dead' AND updated >= :since ORDER BY updated, id LIMIT :limit;

-- When the oldest pending event was stored (by id: the index's first pending row).
-- name: events_died_since before 7
SELECT id, source, source_id, NULL, status, attempts, claim_gen, error, created, updated,
       available_at, claimed_at, run_id
FROM events WHERE status = 'dead' AND updated >= :since ORDER BY updated, id LIMIT :limit;

-- name: pending_oldest
SELECT created FROM events INDEXED BY events_by_status WHERE status = 'pending'
ORDER BY id LIMIT 1;

-- --- the desk, round three: run now, timer actions, dead groups, workers, approval links --

-- name: event_backoff
SELECT status, available_at FROM events WHERE id = :id;

-- Only a pending event still waiting out its backoff: one claimed meanwhile is left alone.
-- name: event_run_now
UPDATE events SET available_at = :now, updated = :now
WHERE id = :id AND status = 'pending' AND available_at > :now;

-- name: timer_get
SELECT id, due, every, catch_up, payload, key_source, key_id, last_fired, last_skipped,
       overflow, kind, broken, paused
FROM timers WHERE id = :id;

-- name: timer_pause
UPDATE timers SET paused = :paused WHERE id = :id AND paused <> :paused;

-- name: timers_list_paused
SELECT id, due, every, catch_up, payload, key_source, key_id, last_fired, last_skipped,
       overflow, kind, broken, paused
FROM timers ORDER BY due, id LIMIT :limit;

-- Dead events grouped by the first line of their error (a scan of the dead events, read
-- when the operator asks for the groups, never by a poll).
-- name: dead_groups
SELECT line, count(*), min(id), max(id) FROM (
    SELECT id, CASE WHEN instr(coalesce(error, ''), char(10)) > 0
                    THEN substr(error, 1, instr(error, char(10)) - 1)
                    ELSE coalesce(error, '') END AS line
    FROM events INDEXED BY events_by_status WHERE status = 'dead')
GROUP BY line ORDER BY count(*) DESC, line LIMIT :limit;

-- name: dead_group_ids
SELECT id FROM events INDEXED BY events_by_status
WHERE status = 'dead'
  AND CASE WHEN instr(coalesce(error, ''), char(10)) > 0
           THEN substr(error, 1, instr(error, char(10)) - 1)
           ELSE coalesce(error, '') END = :line
ORDER BY id LIMIT :limit;

-- name: event_error
SELECT status, error FROM events WHERE id = :id;

-- name: worker_seen
INSERT INTO workers(holder, host, pid, started, seen) VALUES (:holder, :host, :pid, :now, :now)
ON CONFLICT(holder) DO UPDATE SET host = excluded.host, pid = excluded.pid, seen = excluded.seen,
    started = CASE WHEN workers.pid = excluded.pid AND workers.host = excluded.host
                   THEN workers.started ELSE excluded.started END;

-- name: worker_gone
DELETE FROM workers WHERE holder = :holder;

-- name: workers_list
SELECT holder, host, pid, started, seen FROM workers ORDER BY started, holder LIMIT :limit;

-- name: lease_taken_at
SELECT at FROM lease_history WHERE gen = :gen;

-- name: approval_run
SELECT run_id FROM approvals WHERE request_id = :id;

-- name: event_by_key
SELECT id FROM events WHERE source = :source AND source_id = :source_id;

-- name: approvals_of_runs
SELECT request_id FROM approvals WHERE run_id IN (SELECT value FROM json_each(:ids))
ORDER BY requested, request_id;

-- An operator gave the inbox work without a new pending row (run now, a timer resumed):
-- nothing to say on a file, whose watchers wake on any commit.
-- name: inbox_notify
SELECT 1;

-- --- files of an older schema, read as they are (reads never migrate) ----------------------

-- Before schema 9 no timer could be paused.
-- name: timer_due_any before 9
SELECT 1 FROM timers WHERE due <= :now AND broken IS NULL LIMIT 1;
-- name: timers_due before 9
SELECT id, due, every, catch_up, payload, key_source, key_id, last_fired, last_skipped,
       overflow, kind, broken, json_valid(payload)
FROM timers WHERE due <= :now AND broken IS NULL ORDER BY due, id LIMIT :limit;
-- name: timer_next_due before 9
SELECT min(due) FROM timers WHERE broken IS NULL AND typeof(due) = 'integer';
-- name: timer_get before 9
SELECT id, due, every, catch_up, payload, key_source, key_id, last_fired, last_skipped,
       overflow, kind, broken, 0
FROM timers WHERE id = :id;
-- name: timers_list_paused before 9
SELECT id, due, every, catch_up, payload, key_source, key_id, last_fired, last_skipped,
       overflow, kind, broken, 0
FROM timers ORDER BY due, id LIMIT :limit;

-- Before schema 10 no worker was recorded but the lease holder (in the lease row).
-- name: workers_list before 10
SELECT NULL, NULL, NULL, NULL, NULL WHERE 0;
-- name: worker_seen before 10
SELECT NULL WHERE 0;
-- name: worker_gone before 10
SELECT NULL WHERE 0;
