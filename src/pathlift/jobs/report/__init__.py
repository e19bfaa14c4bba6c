"""The main job: measure a network end to end into a ``Report``, then render it."""

from pathlift.jobs.report.measure import Report, measure_report
from pathlift.jobs.report.render import render_report
from pathlift.jobs.report.run import ReportResult, run_report
from pathlift.track import PathNormTracker

__all__ = ["PathNormTracker", "Report", "ReportResult", "measure_report", "render_report",
           "run_report"]
