"""The bearer tokens of the session's secure server (conftest's
`shared_secure`): an admin, and two generate callers."""

from __future__ import annotations

ADMIN, GENERATE, GENERATE_B = "admin-token", "gen-token", "gen-token-b"
