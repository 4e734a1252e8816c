"""The worker runtime: the loop that serves an inbox by calling an agent, and what the agent gets.

`worker.py` is the loop (lease, scheduler, claim, agent call, fenced finish, dispatch);
`context.py` is the `RunContext` an agent is handed; `channels.py` the outbox's send
channels; `listening_worker.py` and `fleet_worker.py` the PostgreSQL workers (imported only
when asked for: they need psycopg).
"""

from .context import Agent, LeaseLost, RunAbandoned, RunContext
from .worker import Worker, WorkerStats, default_holder, run_worker

__all__ = [
    "Agent",
    "LeaseLost",
    "RunAbandoned",
    "RunContext",
    "Worker",
    "WorkerStats",
    "default_holder",
    "run_worker",
]
