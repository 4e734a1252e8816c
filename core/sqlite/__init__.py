"""The SQLite backend: one file is one inbox (its connection, schema, named statements and
the file notification that wakes other processes)."""
