"""The local store's permit ids: UUIDv7, unique, ordered by the millisecond they were made."""

from __future__ import annotations

import time
import uuid

from gateway.governance._local import permit_id


def test_permit_ids_are_uuid7_ordered_by_time_and_unique() -> None:
    before = time.time_ns() // 1_000_000
    ids = [permit_id() for _ in range(20_000)]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    stamps = []
    for text in ids:
        assert len(text) == 32 and text == text.lower()
        u = uuid.UUID(hex=text)
        assert u.version == 7 and u.variant == uuid.RFC_4122
        stamps.append(u.int >> 80)
    assert before <= stamps[0] and stamps[-1] <= after
    assert stamps == sorted(stamps)  # made later, sorts later (to the millisecond)
    # Within one millisecond the rest is random: ids of the same ms differ.
    same_ms = [i for i, s in zip(ids, stamps, strict=True) if s == stamps[0]]
    assert len(set(x[12:] for x in same_ms)) == len(same_ms)
