"""The commands of `onwatch`, grouped by what they act on."""
