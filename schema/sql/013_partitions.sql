-- 013_partitions.sql: what a database needs to be one partition of a
-- queue spread over several behind a PL/Proxy proxy: its number in the
-- cluster, written by harel_partition, which also makes its seqs disjoint
-- from the other partitions'. The functions are in
-- functions/85_partitions.sql. A database that is not a partition keeps no
-- row here and works as before.
CREATE TABLE IF NOT EXISTS transport_partition (
    id   BOOLEAN PRIMARY KEY DEFAULT true CHECK (id),
    part INT NOT NULL CHECK (part BETWEEN 0 AND 1023)
);
