-- Where the Kafka response consumer is in each partition: the offset of the next record to
-- apply. Advanced only after the responses before it are committed here, so a restart
-- re-reads at most an already-applied batch (and duplicates resume nothing twice).
CREATE TABLE kafka_offsets (
    topic       text   NOT NULL,
    partition   int    NOT NULL,
    next_offset bigint NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition)
);
