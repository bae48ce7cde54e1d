"""``kernelflow ui``: a live web dashboard of the log, served by uvicorn (Starlette).

``data`` reads NATS (the daemons' read model, tasks' events, a fold of the log kept here
for the run and group pages) and wakes the pages' live streams; ``task_page``,
``group_page`` and ``list_pages`` turn what it read into HTML (with the pure projections);
``html`` holds the escaping and the page shell they share; ``app`` routes requests.
"""
