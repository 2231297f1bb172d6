"""Reports: markdown (jinja2) with a trial table, the best launch command and plots."""

from orchestrator.report.render import ReportData, build_report_data, write_report

__all__ = ["ReportData", "build_report_data", "write_report"]
