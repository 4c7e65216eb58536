"""The runner's default sizing (memoryhub/runner.py; README "Production": sizing)."""

from __future__ import annotations

from memoryhub.runner import POOL_CEILING, RESERVED_CONNECTIONS, default_web_workers, sized_pool


def test_web_processes_get_half_the_cores_but_two_of_two_beside_the_database_and_all_without_it() -> None:
    assert [default_web_workers(n, database_here=True) for n in (1, 2, 3, 4, 16)] == [1, 2, 2, 2, 8]
    assert [default_web_workers(n, database_here=False) for n in (1, 2, 16)] == [1, 2, 16]


def test_every_pool_at_its_fullest_fits_in_max_connections() -> None:
    for max_connections in (20, 50, 100, 200, 500):
        for cores in (1, 2, 8, 32, 64):
            web, workers = default_web_workers(cores, database_here=False), cores
            pool = sized_pool(max_connections, web, workers)
            assert 2 <= pool <= POOL_CEILING
            if pool > 2:  # (below the floor the server is simply too small for the machine)
                assert web * pool + 2 * workers + RESERVED_CONNECTIONS <= max_connections
    assert sized_pool(200, 1, 2) == POOL_CEILING
    assert sized_pool(100, 32, 32) == 2
