"""What the offline tools over the event log (``log export|import|verify``, ``replay``,
``export grpo``, ``report``) are made of.

Every tool reads events as ``(position, event)`` pairs from one of two sources
(``sources``): the live JetStream log (position = stream sequence) or an exported file
(``--from FILE``; position = record number), and folds them with the pure projections of
``projections/``. Nothing is held in memory beyond what the projections keep (per-task
summaries; the turns of tasks not yet ended during a dataset export). Output files are
written next to their target and renamed into place at the end (``files``), so a failed
run leaves nothing half-written.

Where to start: the whole log (default), ``--start-seq N`` (events from that stream
sequence or record number on), or ``--since TIME`` (``since``: an ISO-8601 time, or a
duration back from now such as ``30m``, ``2h``, ``1d``): the tasks that *began* at or
after TIME, each with its whole history, so that an export is still a valid log file, a
dataset holds whole rollouts and a report counts whole tasks. On the live log the read
starts at the first event JetStream stored at or after TIME
(``DeliverPolicy.BY_START_TIME``); in a file, a task's first event's ``at`` decides.
"""
