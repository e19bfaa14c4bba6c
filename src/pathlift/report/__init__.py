"""The main job: measure a network end to end into a ``Report``, then render it."""

from pathlift.report.measure import Report, measure_report
from pathlift.report.render import render_report
from pathlift.report.run import ReportResult, run_report
from pathlift.track import PathNormTracker

__all__ = ["PathNormTracker", "Report", "ReportResult", "measure_report", "render_report",
           "run_report"]
