"""Dialogs of the supervisor TUI, each a ModalScreen returning its answer."""
