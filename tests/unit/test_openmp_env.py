"""The command line sets libgomp's waiting policy before torch loads it, unless the user
set one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from radixserve.cpu.openmp import OPENMP_ENV, openmp_defaults


def test_both_variables_are_set_when_the_user_set_neither():
    env = {"PATH": "/bin"}
    openmp_defaults(env)
    assert env == {"PATH": "/bin", **OPENMP_ENV}


def test_a_users_own_setting_of_either_is_left_alone():
    for given in ({"OMP_WAIT_POLICY": "passive"}, {"GOMP_SPINCOUNT": "0"}):
        env = dict(given)
        openmp_defaults(env)
        assert env == given


SPY = """
import json, os, sys
from radixserve import cli
from radixserve.cpu.openmp import OPENMP_ENV

seen = {}

class TorchImportSpy:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.update({k: os.environ.get(k) for k in OPENMP_ENV})
        return None

sys.meta_path.insert(0, TorchImportSpy())
code = cli.main(["cpu-profile"])
print(json.dumps({"code": code, "seen": seen}))
"""


def test_a_command_sets_them_before_torch_is_imported():
    env = {k: v for k, v in os.environ.items() if k not in OPENMP_ENV}
    out = subprocess.run(
        [sys.executable, "-c", SPY], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"code": 0, "seen": OPENMP_ENV}
