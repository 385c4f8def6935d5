"""Imported last by a warm forkserver (warm.py's preload list): what the preloads made is moved
out of the garbage collector's sight before any rank forks.

Why: a rank forked from the forkserver inherits every object torch and the other preloads made
(about 290,000 with torch._dynamo, against 170,000 in a fresh worker that never imports
dynamo). Python's full collections in the rank would walk all of them, and writing their
collector headers copies each page from the forkserver's memory into the rank's (copy on
write, costly under a sandbox such as gVisor): an allocation-heavy Python loop ran 1.2x slower
in a warm rank than in a fresh one here, 2.2x next to a CPU burner. `gc.freeze()` keeps them
in the permanent generation instead, as CPython's documentation advises before a fork without
exec, so the rank's collections walk only what the script makes.

The cost: a reference cycle among those preloaded objects that the script drops is never
collected (plain reference counting still frees the rest); import-time objects rarely become
garbage.
"""

import gc

gc.collect()
gc.freeze()
