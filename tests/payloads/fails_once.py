"""A worker that fails once: local rank 1 exits 3 the first time (leaving MARKER_DIR/failed), then every worker
ends well. For torchrun's restart of a node's workers (tests/test_own_code.py)."""

import os
import sys
from pathlib import Path

marker = Path(sys.argv[1]) / "failed"
if os.environ.get("LOCAL_RANK") == "1" and not marker.exists():
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("once")
    sys.exit(3)
print(f"done {os.environ.get('LOCAL_RANK')} restart {os.environ.get('TORCHELASTIC_RESTART_COUNT')}", flush=True)
