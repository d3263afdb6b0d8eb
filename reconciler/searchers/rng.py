"""The searcher's random source: numpy's legacy ``RandomState`` (MT19937), as in the reference
(Determined 0.38's ``searcher.go``), with its state kept as JSON so a stored search resumes
bit-exactly.

A new ``RandomState`` costs 130-270 us on the 2-core development machine (numpy seeds a fresh
MT19937 from OS entropy through a SeedSequence, then copies its 624 words one by one, before
the legacy seeding replaces them all), while re-seeding or setting the state of an existing
one costs 3 us or 80 us: a pass of a thousand new one-trial searches spent 0.13-0.27 s making
generators. So generators a finished step gives back (:func:`recycle`) are reused.
"""

import base64
import uuid
from typing import Any

import numpy as np

# Generators no search holds any more (bounded: a step holds one at a time).
_spares: list[np.random.RandomState] = []
MAX_SPARES = 8


def _generator() -> np.random.RandomState:
    return _spares.pop() if _spares else np.random.RandomState()


def recycle(rng: np.random.RandomState) -> None:
    """Give back a generator whose state is no longer needed, for :func:`new_rng` and
    :func:`rng_from_json` to reuse (they overwrite all of its state)."""
    if len(_spares) < MAX_SPARES:
        _spares.append(rng)


def new_rng(seed: int) -> np.random.RandomState:
    """A generator seeded with ``reproducibility.experiment_seed`` (0 <= seed < 2**32), in the
    state ``np.random.RandomState(seed)`` starts in."""
    rng = _generator()
    rng.seed(seed)
    return rng


def rng_to_json(rng: np.random.RandomState) -> dict[str, Any]:
    """The generator's full state as JSON.

    ``{"key": str, "pos": int, "has_gauss": int, "cached_gaussian": float}``, the key's 624
    uint32 words as base64 of their little-endian bytes: one JSON string (3,328 characters)
    instead of 624 numbers, which PostgreSQL parsed into jsonb numerics and compressed at each
    save (two saves a trial in a search of one-trial experiments).
    """
    _, key, pos, has_gauss, cached_gaussian = rng.get_state(legacy=True)
    return {
        "key": base64.b64encode(key.astype("<u4").tobytes()).decode("ascii"),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }


def rng_from_json(data: dict[str, Any]) -> np.random.RandomState:
    """The inverse of ``rng_to_json``; a key stored as a list of 624 numbers (det before
    2026-11-25) is read too."""
    key = data["key"]
    words = (np.frombuffer(base64.b64decode(key), dtype="<u4") if isinstance(key, str)
             else np.array(key, dtype=np.uint32))
    rng = _generator()
    rng.set_state(
        (
            "MT19937",
            words,
            data["pos"],
            data["has_gauss"],
            data["cached_gaussian"],
        )
    )
    return rng


def draw_request_id(rng: np.random.RandomState) -> str:
    """A version-4 UUID from 16 random bytes (four 32-bit draws), as the reference does."""
    return str(uuid.UUID(bytes=rng.bytes(16), version=4))


def draw_trial_seed(rng: np.random.RandomState) -> int:
    """A trial seed in ``[0, 2**31)`` (one 32-bit draw, masked)."""
    return int(rng.randint(0, 2**31))
