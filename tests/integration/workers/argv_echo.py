"""Prints, on every rank, the arguments and the $EVIL variable it received, as one JSON line.

It never imports torch or gpufleet: a plain script under torchrun still runs.
"""

import json
import os
import sys

print("ARGV=" + json.dumps({"argv": sys.argv[1:], "evil": os.environ.get("EVIL")}), flush=True)
