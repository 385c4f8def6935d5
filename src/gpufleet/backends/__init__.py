"""Where nodes come from and how processes start on them.

Every engine implements `base.Backend`: `discover()` lists nodes and devices; `prepare()` turns
one run of a job into a command, environment and files; `start()` runs it and returns a handle to
`poll()`, `signal()` and `kill_tree()`; `lost_nodes()` and `node_lost()` say what a run lost;
`report_host()` and `pids_here` say where workers report and whether their pids are ours.
`local` is this host; `ray` an existing Ray cluster (a job's nodes run through `ray_run`'s
actors, started by one local driver process); `sim` a synthetic pool that only discovers;
`fake` plays a test's scripted worker events without processes.
"""
