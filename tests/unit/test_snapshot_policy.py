"""When a partition's index is due for a snapshot (store/snapshots.py SnapshotPolicy), alone."""

from __future__ import annotations

from ragsidecar.config import StoreConfig
from ragsidecar.store.snapshots import SnapshotPolicy, policy_of


def test_many_changes_are_due_at_once_and_a_few_once_the_partition_rests() -> None:
    policy = SnapshotPolicy(after_changes=100, idle_s=5.0)
    assert policy.due(100, idle_for=0.0)  # a reopen would replay that many
    assert not policy.due(99, idle_for=4.9)
    assert policy.due(1, idle_for=5.0)


def test_nothing_unsaved_is_never_due() -> None:
    assert not SnapshotPolicy(after_changes=1, idle_s=0.1).due(0, idle_for=3600.0)


def test_the_store_settings_make_the_policy_and_zero_turns_snapshots_off() -> None:
    assert policy_of(StoreConfig(snapshot_after_changes=250, snapshot_idle_s=3.0)) == SnapshotPolicy(250, 3.0)
    assert policy_of(StoreConfig(snapshot_after_changes=0)) is None
