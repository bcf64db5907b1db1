-- Version 5 stored plain creates as batches, one row per flush. Version 6 goes back to
-- one row per request and converts any database that has the batches, so a database
-- created now skips this version: it never has them.
SELECT 1;
