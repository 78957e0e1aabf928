"""attnbook: the companion book's plumbing, kept out of the maths library ``attnid``.

``chapter``     ``setup``: one call per chapter (device, recorded parameters, bound data writer/reader)
``provenance``  atomic writes into data/, provenance sidecars, which data files are stale and why
``paths``       finds the book's root (never assumed from where the package is installed)
``devices``     the DEVICE parameter: cpu, cuda or auto
``tables``      text and Markdown tables for the chapters
``style``       the figures' matplotlib style
"""

from .chapter import Chapter, setup

__all__ = ["Chapter", "setup"]
