"""One rank of the collectives workload with --device hpu under the Habana bridge STAND-IN of
tests/test_gaudi_workloads.py (no real bridge, no HPU): `python hpu_standin_collectives.py CALLS.json ARGS...`
writes the bridge calls this rank made to CALLS.json and exits with the workload's exit code."""

import json
import sys

import pytest

from tests.test_gaudi_workloads import HabanaStandIn
from toolkit.workloads.collectives import main

bridge = HabanaStandIn(pytest.MonkeyPatch())
code = main(sys.argv[2:])
with open(sys.argv[1], "w") as out:
    json.dump(bridge.calls, out)
sys.exit(code)
