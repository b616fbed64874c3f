"""gpuwatchd: a per-node GPU cluster health agent."""

__version__ = "0.2.0"
