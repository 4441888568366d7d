"""examples/degrade_link.py: steps in order, and a refused step reported with the database's words."""

from __future__ import annotations

from conftest import load_example, run_example
from nextmini import Controller

dl = load_example("degrade_link")


def test_steps_follow_the_command_line():
    args = dl.build_parser().parse_args(
        ["--link", "a-b", "--set", "rate_bps=5", "--set", "queue={\"limit_packets\": 9}", "--then", "2", "--set", "loss_ppm=1"]
    )
    assert dl.steps(args.sequence) == [
        (0.0, {"rate_bps": 5, "queue": {"limit_packets": 9}}),
        (2.0, {"loss_ppm": 1}),
    ]


def test_a_refused_step_stops_with_the_databases_message(db, dsn):
    done = run_example("degrade_link", dsn, "--link", "a-b", "--set", "loss_ppm=10000", "--then", "0", "--set", "loss_ppm=2000000")
    assert done.returncode == 2, done.stderr
    assert "step 1: a-b both" in done.stdout
    assert "links a-b: params_forward.loss_ppm: must be at most 1000000, got 2000000" in done.stderr
    with Controller(dsn) as ctl:
        assert ctl.link("a-b").params_forward["loss_ppm"] == 10_000  # step 1 stays, step 2 never landed
