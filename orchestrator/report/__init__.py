"""A run report: one self-contained HTML file with a run's plans compared, its Gantt, idle time
per device, throughput, loss and accuracy, and its faults and recoveries, drawn with plotly.

:mod:`~orchestrator.report.record` reads a run in the shared formats (from the run page's
downloads, or built by the dashboard from its database), :mod:`~orchestrator.report.figures`
draws it and :mod:`~orchestrator.report.document` writes the file. Only the last two import
plotly, which devices running the agent do not install.
"""
