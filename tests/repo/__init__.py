"""Checks of the repository itself (layout, names, import layers,
deployment files, the contract); no engine."""
