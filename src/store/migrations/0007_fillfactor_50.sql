-- Room on each page for one new version of every row on it: a request's row is updated
-- after each step, and an update is HOT (no index entries written, its WAL record
-- shortened to the changed bytes) only when the new version fits on the old one's page.
-- With fillfactor 80 a page of ~10 new rows had room for two of their first updates, so
-- four in five of those went to another page and wrote an entry in each of the three
-- indexes. (The update that finishes a request changes indexed columns and is never
-- HOT; by then the first update's old version can be pruned to make room.) Applies to
-- pages filled from now on.
ALTER TABLE service_requests SET (fillfactor = 50);
