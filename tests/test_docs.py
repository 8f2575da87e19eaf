"""The environment table (docs/environment.md) and the variables the package reads stay in step."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_env_table_is_current():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "env_table.py"), "--check"],
                            check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_every_env_var_read_is_declared():
    from hybrid_ep.config import ENV_VARS

    declared = {v.name for v in ENV_VARS}
    source = "\n".join(p.read_text() for p in (ROOT / "python" / "hybrid_ep").rglob("*.py"))
    read = set(re.findall(r'env_\w+\("([A-Z0-9_]+)"', source))
    read |= set(re.findall(r'_raw\("([A-Z0-9_]+)"\)', source))
    assert read <= declared, read - declared
