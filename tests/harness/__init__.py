"""The in-process group harness: whole nodes on one event loop, a fake clock and an in-memory
peer network (docs/testing.md, "The in-process group harness")."""
