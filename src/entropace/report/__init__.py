"""``entropace report``: plots and pace diagnostics of one or several run directories.

- :func:`load_run`: parse ``RUN/metrics.jsonl`` into per-key series (:class:`RunData`).
- :func:`write_report`: PNG figures (runs side by side) and ``summary.md`` / ``.html`` / ``.json``.
"""

from entropace.report.runs import RunData, Series, load_run
from entropace.report.summary import PaceDiagnostics, pace_diagnostics, write_report

__all__ = ["PaceDiagnostics", "RunData", "Series", "load_run", "pace_diagnostics", "write_report"]
