-- 014_growth.sql: growing a partitioned queue from N to 2N partitions.
-- transport_partition learns the partition count this partition was
-- armed for (harel_grow: groups whose home is another
-- partition are refused here from then on, unless they still have
-- something here) and, while the cluster grows, the count it grew from
-- (NULL once harel_grown has seen every moving group leave). The
-- functions are in functions/90_growing.sql.
ALTER TABLE transport_partition ADD COLUMN IF NOT EXISTS parts INT
    CHECK (parts BETWEEN 1 AND 1024 AND parts & (parts - 1) = 0 AND part < parts);
ALTER TABLE transport_partition ADD COLUMN IF NOT EXISTS grown_from INT
    CHECK (grown_from * 2 = parts);
