"""Seeded generator of varied Mooncake-format traces, to check policies off their design trace.

Run from the repository root:
    .venv/bin/python -m bench.tooling.trace_gen --profile chat --seed 1 > chat.jsonl

Each request is a chain of block hashes as Mooncake writes them: a shared
system prompt (a few, Zipf popular), optionally a shared document (Zipf
popular), then a session's own history. Sessions are multi-turn: a later turn
repeats the earlier prompt and appends new blocks, and the last block of a
prompt is partial, so the next turn sees it under a new hash. Scans are long
one-off prompts. Profiles weigh these differently; the seed fixes everything.
The ``random`` profile draws the weights themselves from the seed: a mix that
no policy was designed on, for checking one against workloads nobody chose.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TextIO

from bench.tooling.common import output_closed

BLOCK_TOKENS = 512


@dataclass(frozen=True)
class Profile:
    """The mix of one kind of workload; probabilities are per request."""

    new_session: float
    """A request starts a new session (else it continues an active one, or scans)."""
    scan: float
    """A request is a one-off long prompt."""
    document: float
    """A new session opens with a shared document."""
    system_prompts: int
    documents: int
    zipf: float
    """Exponent of the popularity of system prompts, documents and active sessions."""
    active_sessions: int
    """Sessions that may still continue; the oldest is dropped beyond this."""
    turn_blocks: tuple[int, int]
    """New blocks per turn, inclusive range."""
    repeat: float = 0.0
    """A request resends a prompt of the catalogue (the first ``documents`` prompts sent)
    exactly, partial block and all, once the catalogue is full."""


PROFILES: dict[str, Profile] = {
    "chat": Profile(0.35, 0.02, 0.1, 4, 50, 1.1, 400, (1, 8)),
    "rag": Profile(0.5, 0.02, 0.8, 2, 300, 0.9, 200, (2, 6)),
    "agent": Profile(0.15, 0.01, 0.3, 8, 40, 1.2, 60, (1, 4)),
    "scan": Profile(0.3, 0.25, 0.2, 3, 80, 1.0, 300, (1, 10)),
    "repeat": Profile(0.5, 0.02, 0.3, 4, 400, 0.8, 200, (2, 8), repeat=0.6),
}


RANDOM = "random"
"""The profile name whose mix is drawn from the seed (``random_profile``)."""


def random_profile(seed: int) -> Profile:
    """A mix drawn from ``seed``, each weight over the range the named profiles span and
    beyond: from nearly all continuing sessions to mostly new ones, no scans to many,
    sessions that come back soon to thousands that may, and resent prompts or none."""
    rng = random.Random(f"profile-{seed}")
    return Profile(
        new_session=round(rng.uniform(0.05, 0.7), 2),
        scan=rng.choice((0.0, 0.01, 0.05, 0.15, 0.3)),
        document=round(rng.uniform(0.0, 0.9), 2),
        system_prompts=rng.randint(1, 10),
        documents=rng.choice((10, 40, 100, 300, 1000)),
        zipf=round(rng.uniform(0.6, 1.4), 2),
        active_sessions=rng.choice((30, 100, 300, 1000, 3000)),
        turn_blocks=rng.choice(((1, 4), (1, 8), (2, 6), (4, 16), (1, 30))),
        repeat=rng.choice((0.0, 0.0, 0.0, 0.3, 0.7)),
    )


def profile_named(name: str, seed: int) -> Profile:
    """The profile ``--profile name`` runs: a named one, or the mix ``seed`` draws."""
    return random_profile(seed) if name == RANDOM else PROFILES[name]


class _Ids:
    """Fresh block hashes, counted up from zero."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, n: int) -> list[int]:
        start = self.next
        self.next += n
        return list(range(start, start + n))


def _zipf_pick(rng: random.Random, n: int, exponent: float) -> int:
    """An index in [0, n), index 0 the most popular."""
    weights = [1.0 / (rank + 1) ** exponent for rank in range(n)]
    return rng.choices(range(n), weights=weights)[0]


def generate(profile: Profile, requests: int, seed: int) -> Iterator[list[int]]:
    """Each request's hash ids, in arrival order."""
    rng = random.Random(seed)
    ids = _Ids()
    systems = [ids.take(rng.randint(1, 6)) for _ in range(profile.system_prompts)]
    documents = [ids.take(rng.randint(4, 30)) for _ in range(profile.documents)]
    sessions: list[list[int]] = []  # most recently active last; each ends in a partial block
    catalogue: list[list[int]] = []
    low, high = profile.turn_blocks
    for _ in range(requests):
        full = profile.repeat and len(catalogue) == profile.documents
        if full and rng.random() < profile.repeat:
            yield list(catalogue[_zipf_pick(rng, len(catalogue), profile.zipf)])
            continue
        draw = rng.random()
        if draw < profile.scan:
            yield ids.take(rng.randint(40, 200))
            continue
        if draw < profile.scan + profile.new_session or not sessions:
            chain = list(systems[_zipf_pick(rng, len(systems), profile.zipf)])
            if rng.random() < profile.document:
                chain += documents[_zipf_pick(rng, len(documents), profile.zipf)]
        else:
            # Recently active sessions are likelier to continue.
            index = len(sessions) - 1 - _zipf_pick(rng, len(sessions), profile.zipf)
            chain = sessions.pop(index)[:-1]  # the partial block is completed under a new hash
        chain += ids.take(rng.randint(low, high) + 1)
        sessions.append(chain)
        if len(sessions) > profile.active_sessions:
            sessions.pop(0)
        if profile.repeat and len(catalogue) < profile.documents:
            catalogue.append(list(chain))
        yield list(chain)


def write_trace(profile: Profile, requests: int, seed: int, out: TextIO) -> None:
    """The trace as Mooncake JSON lines."""
    rng = random.Random(seed + 1)
    for timestamp, hash_ids in enumerate(generate(profile, requests, seed)):
        record = {
            "timestamp": timestamp,
            "input_length": len(hash_ids) * BLOCK_TOKENS - rng.randint(0, BLOCK_TOKENS - 1),
            "output_length": rng.randint(1, 1000),
            "hash_ids": hash_ids,
        }
        out.write(json.dumps(record) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=[*sorted(PROFILES), RANDOM], default="chat")
    parser.add_argument("--requests", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.requests < 1:
        parser.error("--requests must be positive")
    profile = profile_named(args.profile, args.seed)
    if args.profile == RANDOM:
        print(profile, file=sys.stderr)
    try:
        write_trace(profile, args.requests, args.seed, sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:
        output_closed()


if __name__ == "__main__":
    main()
