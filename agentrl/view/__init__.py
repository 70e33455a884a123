"""The run viewer (``agentrl view``): what a run trained on, token by token, in a browser.

    rundata.py   RunData: the files of a run directory, read as they grow (metrics, samples, eval)
    viewer.py    build_app: the page and the JSON routes it polls (served on 127.0.0.1)
    page.py      render_page: static/page.html with its styles, script and data inline
    export.py    export_report: the page and its data as one bounded, self-contained HTML file
    static/      page.html, viewer.css, viewer.js (hand-written; no external asset)

This package reads run directories; nothing in training imports it. It sits beside
``agentrl.run`` in the layers, under the CLI.
"""

from agentrl.view.rundata import RunData

__all__ = ["RunData"]
