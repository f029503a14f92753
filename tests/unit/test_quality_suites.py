"""The quality suites' registry: ``rmqlake quality`` checks ``--suite`` before Spark starts, and imports Great
Expectations while the JVM starts, so listing and choosing suites must not import GX."""

import subprocess
import sys

from tests.conftest import CONF


def run_fresh(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter: this one may have imported GX already."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_suites_are_listed_and_chosen_without_importing_great_expectations():
    done = run_fresh(
        "import sys\n"
        "from rmqlake.quality.suites import SUITES, select_suites\n"
        "assert [s.name for s in select_suites(['rejected'])] == ['rejected.critical', 'rejected.warning']\n"
        "assert select_suites(None) == list(SUITES.values())\n"
        "try:\n"
        "    select_suites(['nope'])\n"
        "except KeyError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('an unknown suite was accepted')\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('great_expectations'))\n"
        "assert not loaded, loaded\n"
    )
    assert done.returncode == 0, done.stderr


def test_the_background_import_makes_the_expectations_available():
    done = run_fresh(
        "import sys\n"
        "from rmqlake.config import load_settings\n"
        "from rmqlake.quality.suites import SUITES, import_gx_in_background\n"
        "import_gx_in_background().join(timeout=240)\n"
        "assert 'great_expectations.expectations' in sys.modules\n"
        f"settings = load_settings({str(CONF)!r})\n"
        "built = [e for s in SUITES.values() for e in s.expectations(settings)]\n"
        "assert built and all(type(e).__module__.startswith('great_expectations.') for e in built), built\n"
    )
    assert done.returncode == 0, done.stderr
