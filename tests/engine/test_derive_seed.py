"""``derive_seed`` on Python ints is bit for bit the tensor splitmix64 it replaced."""

import random

from gambit.engine.engine import _derive_seed_tensor, derive_seed


def test_python_seed_equals_tensor_reference():
    r = random.Random(0)
    for _ in range(500):
        parts = [r.randrange(0, 1 << r.choice([4, 20, 40, 62])) for _ in range(r.randint(0, 4))]
        assert derive_seed(*parts) == _derive_seed_tensor(*parts)
    assert derive_seed(0, 1) != derive_seed(1, 0) and 0 <= derive_seed(7) < 1 << 63
