"""The one error a bad checkpoint raises, shared by the readers (``checkpoint``, ``gguf_file``) and the commands."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint this tool cannot read: missing, truncated, corrupt, unsupported, or not as its config says."""
