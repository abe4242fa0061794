"""What several test modules share that is not a fixture: constants and
helpers, one small module per concern. Shared fixtures live in
tests/conftest.py (pytest provides them); no test module imports another test
module or the conftest (tests/ruff.toml and tests/repo/test_layout.py keep it so)."""
