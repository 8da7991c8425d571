"""The CPU demo: SFT warm start, then StarPO-S RL, on Bandit, Sokoban and FrozenLake.

    python launch/demo.py --workdir runs/demo            # the full demo (~20.5 min alone on 2 CPU cores)
    python launch/demo.py --workdir runs/demo_q --quick  # a 1-2 minute smoke run (learns little)

Everything else (stages, overrides, outputs, --publish) is in `ragen_jax/recipes/demo.py`, which
scripts and benches use as a library.
"""

import sys

if __name__ == "__main__":  # before jax is imported: glibc malloc huge pages (why and when: ragen_jax/runtime.py)
    from ragen_jax.runtime import use_transparent_hugepages

    use_transparent_hugepages()

# After the re-exec above, so that jax starts in the final process.
from ragen_jax.recipes.demo import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
