"""The trace generator: seeded, Mooncake-shaped, and its random mixes stay in range.

Held-out checks of the cache policies rest on these traces, so what they
promise (the same trace for the same seed, prefix chains whose later turns
extend earlier ones, a prompt's partial block never reused by a later turn)
is checked on what the generator writes, not on its parameters.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bench.tooling.trace_gen import (
    PROFILES,
    RANDOM,
    generate,
    profile_named,
    random_profile,
    write_trace,
)

ROOT = Path(__file__).resolve().parents[2]


def _trace(profile_name: str, seed: int, requests: int = 400) -> list[dict]:
    out = io.StringIO()
    write_trace(profile_named(profile_name, seed), requests, seed, out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.mark.parametrize("profile", [*sorted(PROFILES), RANDOM])
def test_a_seed_gives_the_same_trace_and_another_seed_another(profile: str) -> None:
    assert _trace(profile, 5) == _trace(profile, 5)
    assert _trace(profile, 5) != _trace(profile, 6)


@pytest.mark.parametrize("profile", [*sorted(PROFILES), RANDOM])
def test_records_are_mooncake_lines_whose_lengths_fit_their_blocks(profile: str) -> None:
    for record in _trace(profile, 3):
        assert set(record) == {"timestamp", "input_length", "output_length", "hash_ids"}
        blocks = len(record["hash_ids"])
        assert blocks >= 1
        assert (blocks - 1) * 512 < record["input_length"] <= blocks * 512


def test_a_session_turn_extends_its_previous_prompt_without_its_partial_block() -> None:
    # Without resends, a prompt's last block is partial: no other request holds it,
    # and a later turn of the same session repeats every block before it.
    requests = list(generate(PROFILES["chat"], 600, seed=2))
    holders = Counter(block for request in requests for block in set(request))
    assert all(holders[request[-1]] == 1 for request in requests)
    continued = sum(
        any(
            len(earlier) > 7 and request[: len(earlier) - 1] == earlier[:-1]
            for earlier in requests[:index]
        )
        for index, request in enumerate(requests)
    )
    assert continued > 200


def test_the_repeat_profile_resends_whole_prompts_partial_block_and_all() -> None:
    requests = [tuple(r) for r in generate(PROFILES["repeat"], 2000, seed=1)]
    seen: set[tuple[int, ...]] = set()
    resent = 0
    for request in requests:
        resent += request in seen
        seen.add(request)
    assert resent > 500


@pytest.mark.parametrize("seed", range(40))
def test_a_random_mix_is_a_valid_profile(seed: int) -> None:
    profile = random_profile(seed)
    assert profile.new_session > 0 and profile.scan >= 0 and profile.new_session + profile.scan < 1
    assert 0 <= profile.document <= 1 and 0 <= profile.repeat < 1
    assert profile.system_prompts >= 1 and profile.documents >= 1 and profile.active_sessions >= 1
    low, high = profile.turn_blocks
    assert 1 <= low <= high
    assert profile.zipf > 0


def test_random_mixes_differ_from_seed_to_seed() -> None:
    assert len({random_profile(seed) for seed in range(40)}) == 40


def test_the_command_prints_the_drawn_mix_on_stderr_and_refuses_no_requests() -> None:
    command = [sys.executable, "-m", "bench.tooling.trace_gen", "--profile", "random"]
    done = subprocess.run(
        [*command, "--seed", "9", "--requests", "5"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    assert len(done.stdout.splitlines()) == 5
    assert done.stderr.strip() == repr(random_profile(9))
    refused = subprocess.run(
        [*command, "--requests", "0"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert refused.returncode == 2
    assert "--requests must be positive" in refused.stderr
