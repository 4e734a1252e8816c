"""The engine: every transaction of an inbox written once, whatever the database.

Each module holds the transaction scripts of one part of the rules (intake, lease, runs,
timers and the scheduler, approvals, outbox, operator actions, effects, reads): a script
checks the fence, decides (with plans.py, timing.py, decoding.py: plain Python) and writes,
through the `Tx` a backend's dialect gives it (tx.py). Nothing here imports a database
driver or knows which database it runs on.
"""
