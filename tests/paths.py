"""Where things are, for tests in any folder: the tests' root (helpers, fixtures, case
scripts) and the repository's root (examples, benchmarks, pyproject.toml)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FIXTURES = TESTS / "fixtures"
