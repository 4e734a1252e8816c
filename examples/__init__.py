"""Examples of agents onwatch runs; `--agent examples.refund_agent:handle` works once the
project is installed."""
