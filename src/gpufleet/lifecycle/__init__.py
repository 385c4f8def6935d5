"""Lifecycles kept in the store: pools (where devices come from), clusters (devices held) and
jobs (supervised runs on a cluster), with their statuses as types.

Nothing here starts a process or asks a machine anything: that is the backends' business.
"""
