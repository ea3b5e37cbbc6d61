"""The CPU facts read without torch, and the speculation cap measured per vendor."""

import subprocess
import sys
from pathlib import Path

from gambit import cpu_info


def test_spec_cap_follows_the_vendor_measurements():
    assert cpu_info.default_spec_max_batch("GenuineIntel") == 4
    assert cpu_info.default_spec_max_batch("AuthenticAMD") == cpu_info.SPEC_MAX_BATCH == 8
    assert cpu_info.default_spec_max_batch("") == 8  # unknown: the default
    from gambit.deployments.local import ServeConfig
    from gambit.engine.config import SpecConfig

    here = cpu_info.default_spec_max_batch()
    assert SpecConfig().max_batch == ServeConfig().spec_max_batch == here


def test_cpu_info_and_the_launcher_config_load_no_torch():
    code = ("import sys; import gambit.cpu_info as c, gambit.deployments.local as l; "
            "print(c.cpu_vendor() != None, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "services")})
    assert out.returncode == 0, out.stderr[-1000:]
    assert out.stdout.split() == ["True", "False"]
