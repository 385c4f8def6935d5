"""`gpufleet server`: one process that owns the store, the queue, the allocator's view of the
pools and the supervisors' liveness, behind an authenticated JSON API (`api.py`), with the loop
that starts queued jobs (`loop.py`). The CLI reaches it through `client.py`; for one person the
CLI starts a local one on demand (`local.py`)."""

API_VERSION = 1  # bumped when a client of the previous version would misread an answer
