"""Prints the rank environment a user script sees, as one JSON line, and its argv."""

import json
import os
import sys

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
print(json.dumps({"env": {n: os.environ.get(n) for n in NAMES}, "argv": sys.argv, "path0": sys.path[0],
                  "name": __name__}))
