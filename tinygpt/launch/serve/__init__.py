"""serve/: `launch.py serve`, a work directory's sweeps as live pages in a browser: what the pages ask, answered
through the library (`reading`: the sweeps, a sweep's status, its runs' metrics read again only when they changed,
a run's log, samples, attention maps and use of its allocation) and the server that hands them over on the loopback
to the holder of its token (`server`), with the pages it sends (assets/: our HTML, script and style, and uPlot,
vendored); from a laptop, the server run on the login node and a port here forwarded to it (`page_forward`).

Imports api (it reads as the library does), remote/ (the laptop's SSH connection) and the ground floor; nothing but
commands/ imports it.
"""
