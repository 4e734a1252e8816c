"""onwatch's terminal supervisor: the Textual app over a live inbox (imported lazily)."""
