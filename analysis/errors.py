"""Errors of the analysis package: one-line messages a user can act on (no torch needed)."""
from __future__ import annotations

from quartet.errors import QuartetError


class AnalysisError(QuartetError, ValueError):
    """Bad input to a fit or a loader: missing columns, non-positive losses, too few points, ..."""
