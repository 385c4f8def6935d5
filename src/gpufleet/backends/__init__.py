"""Where nodes come from and how processes start on them.

A backend is small on purpose: `discover()` lists nodes and devices; `start()` runs an argument
list and returns a handle to `signal()` and `poll()`. `local` is this host; `ray` an existing Ray
cluster (a job's nodes run through `ray_run`'s actors, started by one local driver process);
`sim` a synthetic pool that only discovers.
"""
