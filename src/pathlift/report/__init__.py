"""The main job: measure a network end to end and write a report with plots."""

from pathlift.report.run import ReportResult, run_report
from pathlift.track import PathNormTracker

__all__ = ["PathNormTracker", "ReportResult", "run_report"]
