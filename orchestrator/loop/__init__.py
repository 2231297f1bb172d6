"""The loop: the one place keep / discard / stop is decided (`controller`), on one host or a pool (`pool`)."""
