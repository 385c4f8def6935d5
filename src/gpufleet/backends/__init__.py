"""Where nodes come from and how processes start on them.

A backend is small on purpose: `discover()` lists nodes and devices; `start()` runs an argument
list on a node and returns a handle to `signal()` and `poll()`. Only `local` exists so far.
"""
