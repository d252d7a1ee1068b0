"""A real kernel per test module (see kernel.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from nb_kernel import Kernel


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    k = Kernel()
    yield k
    k.close()
