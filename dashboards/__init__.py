"""kvscope's Grafana dashboards as code (grafana-foundation-sdk).

The JSON files beside this package are generated: edit the Python, then run
``.venv/bin/python dashboards/generate.py``; a test fails when they differ.
"""
