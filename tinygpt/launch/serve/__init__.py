"""serve/: `launch.py serve`, a work directory's sweeps as live pages in a browser: what the pages ask, answered
through the library (`reading`: the sweeps, a sweep's status, its runs' metrics read again only when they changed,
a run's log) and the server that hands them over on the loopback to the holder of its token (`server`), with the
pages it sends (assets/: our HTML, script and style, and uPlot, vendored).

Imports api (it reads as the library does) and the ground floor; nothing but commands/ imports it.
"""
