"""Sessions: multi-turn trajectories the server holds, token for token (docs/sessions.md)."""
