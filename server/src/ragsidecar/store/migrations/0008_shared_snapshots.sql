-- Partition index snapshots shared through the database (store/shared_snapshots.py): a replica with no snapshot of
-- its own loads the one another replica made, then replays the change log after it, instead of building the index
-- from every stored vector. One snapshot per space, replaced whole in one transaction: its files, cut in parts, and
-- a head row stamped with the partition's change the snapshot holds every change up to.
CREATE TABLE ragsidecar_memory_snapshots (
    space bigint NOT NULL,
    tenant text NOT NULL,
    position bigint NOT NULL,      -- the partition's change sequence the snapshot holds every change up to
    bytes bigint NOT NULL,         -- the parts' bytes together: a download of fewer is torn
    written timestamptz NOT NULL,
    PRIMARY KEY (space, tenant)
);

-- No foreign key (as ragsidecar_memory_removals): rows go with their space.
CREATE TABLE ragsidecar_memory_snapshot_parts (
    space bigint NOT NULL,
    tenant text NOT NULL,
    name text NOT NULL,            -- the file's path inside the snapshot folder
    part integer NOT NULL,         -- its order within the file, from 0
    data bytea NOT NULL,
    PRIMARY KEY (space, tenant, name, part)
);
-- Vectors and graphs do not compress: stored out of line as they are, no compression tried.
ALTER TABLE ragsidecar_memory_snapshot_parts ALTER COLUMN data SET STORAGE EXTERNAL;

CREATE POLICY ragsidecar_maintenance ON ragsidecar_memory_snapshots
    USING (current_setting('ragsidecar.maintenance', true) = 'on');
CREATE POLICY ragsidecar_maintenance ON ragsidecar_memory_snapshot_parts
    USING (current_setting('ragsidecar.maintenance', true) = 'on');
