"""The worker runtime: the loop that serves an inbox by calling an agent, and what the agent gets.

`worker.py` is the loop (lease, scheduler, claim, agent call, fenced finish, dispatch);
`context.py` is the `RunContext` an agent is handed; `isolation.py` runs an agent in a
process of its own (`child.py` is that process); `channels.py` the outbox's send channels;
`listening_worker.py` and `fleet_worker.py` the PostgreSQL workers (imported only when asked
for: they need psycopg). What the worker guarantees about a misbehaving agent is
docs/rules.md#a-misbehaving-agent.
"""

from .context import Agent, LeaseLost, RunAbandoned, RunContext
from .isolation import AgentProcessEnded, IsolatedAgent
from .worker import AgentWedged, Worker, WorkerStats, default_holder, run_worker

__all__ = [
    "Agent",
    "AgentProcessEnded",
    "AgentWedged",
    "IsolatedAgent",
    "LeaseLost",
    "RunAbandoned",
    "RunContext",
    "Worker",
    "WorkerStats",
    "default_holder",
    "run_worker",
]
