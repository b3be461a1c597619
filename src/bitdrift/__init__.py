"""bitdrift: how neural-network results drift when only the tooling changes."""

__version__ = "0.1.0"
